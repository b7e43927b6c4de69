"""Names, labels, owner references and hashes shared by every rendered object.

Why: every child object of a PDDeployment must be found again (labels), cleaned up with it
(owner references) and compared cheaply (template hash); one module keeps those rules identical
for StatefulSets, Services, Secrets and PDBs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pdwarden import __version__
from pdwarden.constants import (
    API_VERSION,
    KIND,
    LABEL_DEPLOYMENT,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
)

Obj = dict[str, Any]


DEFAULT_PDWORKER_IMAGE = f"pdwarden/pdworker:{__version__}"


@dataclass(frozen=True)
class Owner:
    """The PDDeployment that owns what is rendered."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> Obj:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class Names:
    prefill: str
    decode: str
    router: str
    admin_secret: str
    decode_pdb: str
    bootstrap_secret: str
    router_account: str

    def for_role(self, role: str) -> str:
        name: str = getattr(self, role)
        return name


def names(deployment: str) -> Names:
    return Names(
        prefill=f"{deployment}-prefill",
        decode=f"{deployment}-decode",
        router=f"{deployment}-router",
        admin_secret=f"{deployment}-admin",
        decode_pdb=f"{deployment}-decode",
        router_account=f"{deployment}-router",
        bootstrap_secret=f"{deployment}-bootstrap",
    )


def selector_labels(owner: Owner, role: str | None = None) -> dict[str, str]:
    labels = {LABEL_DEPLOYMENT: owner.name}
    if role is not None:
        labels[LABEL_ROLE] = role
    return labels


def object_labels(owner: Owner, role: str | None = None) -> dict[str, str]:
    return {
        **selector_labels(owner, role),
        LABEL_MANAGED_BY: "pdwarden",
        "app.kubernetes.io/name": "pdworker",
        "app.kubernetes.io/instance": owner.name,
        **({"app.kubernetes.io/component": role} if role else {}),
    }


def metadata(owner: Owner, name: str, role: str | None = None, **extra: Any) -> Obj:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": object_labels(owner, role),
        "ownerReferences": [owner.reference()],
        **extra,
    }


def content_hash(value: Any) -> str:
    """A short stable hash of any JSON-able value (used for pod templates)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
