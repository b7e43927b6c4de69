"""Worker tokens, derived rather than stored, so the operator never reads Secrets.

Why: the workers' admin API needs a per-deployment bearer token, and the operator needs to know
it to fail rooms. Reading it back from the Secret would need Secret read access in every watched
namespace (cluster-wide in cluster mode). Instead the token is an HMAC of the deployment's
identity under one operator key (mounted from the operator's own Secret): the operator only ever
*creates* the per-deployment Secret, and can recompute the token after any restart.

The bootstrap key (prefill and decode authenticate their KV handshake with it) is derived from
the same operator key under its own label, so it never equals the admin token: a decode pod
holds the bootstrap key but, unless its admin API is needed, not the admin token.

The key file is read again when it changes (`TokenKey`): a rotated key reaches the operator
without a restart, and the key it replaced is kept, because the deployments' Secrets are only
created, never rewritten: their workers hold tokens of the old key until the Secrets are
recreated, and the operator asks them with those when they refuse the new ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
CHECK_EVERY_S = 1.0  # the key file is looked at (a stat) at most this often
# After a rotation, every reconcile pass recreates a deployment's Secrets if they were deleted
# (SECURITY.md, step 3), for this long; then only passes that apply everything do.
ROTATION_WINDOW_S = 1800.0

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


class TokenKey:
    """The operator's token key, read again when its file changes, and the key it replaced
    (held until the next rotation or a restart)."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        key: bytes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self._clock = clock
        held = load_key(self.path) if self.path is not None else key
        if held is None or len(held) < MIN_KEY_BYTES:
            raise TokenKeyError(f"the token key must be at least {MIN_KEY_BYTES} bytes")
        self._key: bytes = held
        self._previous: bytes | None = None
        self._rotated_at: float | None = None
        self._stamp = self._stat()
        self._next_check = clock() + CHECK_EVERY_S

    @classmethod
    def of(cls, value: TokenKey | bytes | None) -> TokenKey | None:
        """`value` as a TokenKey: a fixed key (tests, embedded use) or none."""
        return value if isinstance(value, TokenKey) or value is None else cls(key=value)

    def current(self) -> bytes:
        self._refresh()
        return self._key

    def previous(self) -> bytes | None:
        self._refresh()
        return self._previous

    def rotated_lately(self) -> bool:
        """Whether the key was rotated less than ROTATION_WINDOW_S ago (by this process)."""
        self._refresh()
        at = self._rotated_at
        return at is not None and self._clock() - at < ROTATION_WINDOW_S

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        now = self._clock()
        if self.path is None or now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            key = load_key(self.path)
        except TokenKeyError as e:
            log.warning("token key file changed but is not used (%s): keeping the key held", e)
            return
        if key != self._key:
            self._previous, self._key, self._rotated_at = self._key, key, now
            log.info("token key rotated: new tokens derive from the new key; workers that still "
                     "hold tokens of the old one are asked with those")  # fmt: skip
