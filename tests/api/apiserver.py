"""One way to put a pdwarden CRD on a real kube-apiserver and send it documents.

Why: the PDDeployment and PDRemediationPolicy CRD tests (test_crd_apiserver.py,
test_policy_apiserver.py) install, apply and get refused the same way; only the CRD and the
kind differ. Every refusal comes from the API server (OpenAPI schema, CEL rules, strict field
validation): nothing of pdwarden runs here except the generated YAML.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from e2e.fixtures import Cluster, wait_established

from pdwarden import constants


def install(cluster: Cluster, crd_file: Path, crd_name: str, prefix: str) -> Iterator[str]:
    """The CRD installed and Established, and a fresh namespace (deleted afterwards) for a
    test module's objects; use as `yield from` in a module-scoped fixture."""
    out = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=pdwarden-tests",
        "-f", str(crd_file),
    )  # fmt: skip
    assert "Warning" not in out.stderr, out.stderr
    wait_established(cluster, crd_name)
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    yield ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def document(kind: str, name: str, spec: Mapping[str, Any]) -> str:
    body = {"apiVersion": constants.API_VERSION, "kind": kind,
            "metadata": {"name": name}, "spec": dict(spec)}  # fmt: skip
    return yaml.safe_dump(body)


@contextmanager
def applied(cluster: Cluster, ns: str, doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Server-side apply `doc`; yields the spec the API server stored (defaults filled in) and
    deletes the object afterwards."""
    text = yaml.safe_dump(dict(doc))
    out = cluster.kubectl(
        "apply", "--server-side", "--field-manager=pdwarden-tests", "-n", ns, "-o", "json",
        "-f", "-", input=text,
    )  # fmt: skip
    try:
        yield json.loads(out.stdout)["spec"]
    finally:
        cluster.kubectl("delete", "-n", ns, "-f", "-", input=text, check=False)


def assert_refused(cluster: Cluster, ns: str, text: str, field: str, case: str) -> None:
    """A server-side dry run of `text` is refused, in the API server's words, naming `field`."""
    out = cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-",
        input=text, check=False,
    )  # fmt: skip
    assert out.returncode != 0, f"accepted: {case}"
    # kubectl has no client-side schema for custom resources: these are the server's words
    # ("The <Kind> ... is invalid": schema and CEL; "Error from server": strict decoding).
    assert "is invalid" in out.stderr or "Error from server" in out.stderr, out.stderr
    assert field in out.stderr, out.stderr
