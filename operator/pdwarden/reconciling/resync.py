"""When the level-based resync daemon reconciles a PDDeployment again.

Why: a pass's outcome is a function of its inputs only (the object as kopf sees it, and its
children as the watch cache holds them; time enters status only as the moment of a transition), so
a pass over unchanged inputs can do nothing. The daemon used to run one every `--resync-seconds`
for every deployment anyway: 40 passes/s at 200 deployments, each listing from the API server. Now
a pass runs when its inputs changed (the cache counts changes per deployment and wakes the daemon),
at most once per `spacing` seconds so a rollout's stream of pod events costs one pass per interval,
and unconditionally every `full_every` seconds as a safety net (every ROTATION_FULL_EVERY for a
while after a token key rotation). A pass that must be repeated whatever happens (a failed apply
being retried, a spec not yet observed) is never recorded as done. Without a cache (tests with
fakes) every check is due and the daemon sleeps `spacing`: the old behaviour.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden.k8s.cache import ObjectCache
from pdwarden.reconciling.plan import apply_everything
from pdwarden.reconciling.reconcile import PassResult

FULL_EVERY: Final = 300.0
# While the token key was rotated lately, the safety-net pass comes this often instead: a pass
# is what recreates the Secrets a rotation has their owner delete, and a deletion is not watched.
ROTATION_FULL_EVERY: Final = 60.0
Fingerprint = tuple[str | None, int]


def _ids(body: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = body["metadata"]
    return str(meta["uid"]), str(meta["namespace"]), str(meta["name"])


@dataclass
class _Done:
    fingerprint: Fingerprint
    at: float


@dataclass
class ResyncGate:
    cache: ObjectCache | None
    spacing: float
    full_every: float = FULL_EVERY
    done: dict[str, _Done] = field(default_factory=dict)
    started: dict[str, tuple[float, int]] = field(default_factory=dict)  # uid -> (at, version)
    skipped: int = 0  # checks that found nothing changed (a progress counter)
    rotating: Callable[[], bool] | None = None  # the token key was rotated lately

    def _fingerprint(self, body: Mapping[str, Any]) -> Fingerprint | None:
        if self.cache is None:
            return None
        _, namespace, name = _ids(body)
        rv = body["metadata"].get("resourceVersion")
        return (str(rv) if rv else None), self.cache.version(namespace, name)

    def due(self, body: Mapping[str, Any]) -> bool:
        """Whether a pass now could change anything (or the safety-net pass is due)."""
        uid = _ids(body)[0]
        now = time.monotonic()
        fingerprint, done = self._fingerprint(body), self.done.get(uid)
        full_every = self.full_every
        if self.rotating is not None and self.rotating():
            full_every = min(full_every, ROTATION_FULL_EVERY)
        if fingerprint is None or done is None or now - done.at > full_every:
            return True
        if fingerprint != done.fingerprint:
            return True
        self.skipped += 1
        return False

    def begin(self, body: Mapping[str, Any]) -> None:
        uid, namespace, name = _ids(body)
        version = self.cache.version(namespace, name) if self.cache is not None else 0
        self.started[uid] = (time.monotonic(), version)

    def finished(self, body: Mapping[str, Any], result: PassResult | None) -> None:
        """Record a pass that needs no repeat while its inputs stay as they were: the object
        as our own status write left it, its children as they were when the pass began."""
        uid = _ids(body)[0]
        at, version = self.started.get(uid, (time.monotonic(), 0))
        known = result.known if result is not None else None
        generation = body["metadata"].get("generation")
        if known is None or apply_everything(known.status, generation):
            self.done.pop(uid, None)
            return
        rv = known.resource_version or body["metadata"].get("resourceVersion")
        self.done[uid] = _Done((str(rv) if rv else None, version), at)

    async def wait(self, body: Mapping[str, Any]) -> None:
        """Until the next check: a change to the children (or `spacing` seconds), and never
        sooner than `spacing` after the last pass began."""
        uid, namespace, name = _ids(body)
        at, version = self.started.get(uid, (time.monotonic(), 0))
        if self.cache is not None:
            await self.cache.wait_change(namespace, name, version, self.spacing)
        rest = self.spacing - (time.monotonic() - at)
        await asyncio.sleep(max(rest, 0.0))

    def forget(self, uid: str) -> None:
        self.done.pop(uid, None)
        self.started.pop(uid, None)
