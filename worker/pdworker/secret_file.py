"""A token or key read from a mounted Secret file, read again when the file changes.

Why: Secrets are rotated while pods serve. The kubelet rewrites a mounted Secret in place (it
swaps the volume's data directory atomically), so the worker looks at the file again (a stat at
most once per CHECK_EVERY_S, a read only when it changed) and takes the new value without a
restart. Each pod's volume is refreshed on its own schedule, and the operator learns the new
value at yet another moment, so the value replaced stays accepted for `grace_s` after this
process saw the new one and is refused from then on. What presents a value (a decode calling a
prefill) presents the current one first and, refused, the previous one while it is accepted: a
peer that has not seen the new value yet still understands the old.

An empty or unreadable file never replaces a value held (a Secret being rewritten is not a
Secret removed); with no value at all, every call that needs one is refused.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 1.0  # at most one stat of the file per second
DEFAULT_GRACE_S: Final = 300.0  # a kubelet refreshes a Secret volume within ~2 min: 2.5x that
MAX_SECRET_BYTES: Final = 4096  # a token is a line; a larger file is not a token


class Secret:
    """The current value of one token file, and the value it replaced while that is accepted."""

    def __init__(
        self,
        path: str | None = None,
        *,
        what: str = "admin",
        value: str | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path or None
        self.what = what
        self.grace_s = grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value = value or None
        self._previous: str | None = None
        self._previous_until = 0.0
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        if self.path is not None:
            self._refresh(force=True)
            if self._value is None:
                log.warning("%s token file %s unreadable or empty: %s calls are refused until it "
                            "holds a token", what, self.path, what)  # fmt: skip

    @classmethod
    def of(cls, value: Secret | str | None, what: str = "admin") -> Secret:
        """`value` as a Secret: a fixed value (tests, in-process servers) or none."""
        return value if isinstance(value, Secret) else cls(what=what, value=value)

    def __deepcopy__(self, memo: dict[int, object]) -> Secret:
        return self  # a handle on one file, shared (dataclasses.asdict deep-copies fields)

    def __repr__(self) -> str:  # never the value: configs are logged
        return f"Secret({self.what}, file={self.path!r}, held={self._value is not None})"

    def current(self) -> str | None:
        """The value to present now (None: no token configured)."""
        with self._lock:
            self._refresh()
            return self._value

    def accepted(self) -> tuple[str, ...]:
        """Values accepted now: the current one, then the one it replaced while in grace."""
        with self._lock:
            self._refresh()
            out = [] if self._value is None else [self._value]
            if self._previous is not None and self._clock() < self._previous_until:
                out.append(self._previous)
            return tuple(out)

    def matching(self, presented: bytes | None) -> str | None:
        """The accepted value `presented` is (constant-time per value), else None."""
        if presented is None:
            return None
        found = None
        for value in self.accepted():
            if hmac.compare_digest(presented, value.encode()):
                found = value
        return found

    def _refresh(self, force: bool = False) -> None:
        """(under the lock) read the file again if it changed since the last look."""
        if self.path is None:
            return
        now = self._clock()
        if not force and now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            with open(self.path, "rb") as f:
                raw = f.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            if self._stamp is not None:
                log.warning("%s token file %s unreadable (%s): keeping the value held",
                            self.what, self.path, exc)  # fmt: skip
            self._stamp = None
            return
        self._stamp = stamp
        try:
            value = raw.decode().strip() if len(raw) <= MAX_SECRET_BYTES else ""
        except UnicodeDecodeError:
            value = ""
        if not value or value == self._value:
            return
        if self._value is not None:
            self._previous, self._previous_until = self._value, now + self.grace_s
            log.info("%s token file %s changed: the new value is used now, the old one is "
                     "accepted for %.0f s more", self.what, self.path, self.grace_s)  # fmt: skip
        self._value = value
