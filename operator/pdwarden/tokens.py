"""Worker tokens, derived rather than stored, so the operator never reads Secrets.

Why: the workers' admin API needs a per-deployment bearer token, and the operator needs to know
it to fail rooms. Reading it back from the Secret would need Secret read access in every watched
namespace (cluster-wide in cluster mode). Instead the token is an HMAC of the deployment's
identity under one operator key (mounted from the operator's own Secret): the operator only ever
*creates* the per-deployment Secret, and can recompute the token after any restart.

The bootstrap key (prefill and decode authenticate their KV handshake with it) is derived from
the same operator key under its own label, so it never equals the admin token: a decode pod
holds the bootstrap key but, unless its admin API is needed, not the admin token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

MIN_KEY_BYTES = 32  # the chart generates 48 characters; values.yaml and SECURITY.md say 32
BOOTSTRAP_LABEL = "pdwarden.dev/bootstrap-v1"


class TokenKeyError(ValueError):
    """The operator's token key is missing or too short to be safe."""


def load_key(path: str | Path) -> bytes:
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise TokenKeyError(f"cannot read the token key file {path}: {e.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise TokenKeyError(f"the token key in {path} must be at least {MIN_KEY_BYTES} bytes")
    return key


def derive_token(key: bytes, namespace: str, name: str, uid: str) -> str:
    """The admin token of one PDDeployment incarnation (a recreated object gets a new one)."""
    mac = hmac.new(key, f"{namespace}/{name}/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def derive_bootstrap_token(key: bytes, namespace: str, name: str, uid: str) -> str:
    """The KV-handshake key of one PDDeployment incarnation, shared by its prefill and decode.

    Derived under a subkey of its own (HMAC of a label), so no choice of names can make it
    equal an admin token.
    """
    subkey = hmac.new(key, BOOTSTRAP_LABEL.encode(), hashlib.sha256).digest()
    mac = hmac.new(subkey, f"{namespace}/{name}/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")
