"""The PDDeployments' children (Pods, StatefulSets, Deployments) kept in memory by watches.

Why: every reconcile pass and every remediation cycle lists a deployment's pods and workloads.
Asked of the API server, that is 2-3 LISTs per deployment every 5 s: at 200 deployments about
200 requests/s that a watch serves for nothing (bench/fleet.py measured it). Here one watch per
kind (per namespace when the operator is namespaced) keeps every object that carries the
deployment label; `CachedKube` answers the shells' `list` calls from it behind the unchanged
`KubeApi` port, and asks the API server whenever the cache cannot answer exactly (not synced
yet, a selector it cannot match, a kind it does not hold).

It also counts changes per deployment (`version`, `wait_change`): the resync daemon wakes when
a child changed instead of reconciling every deployment on a timer.

Objects handed out are the cache's own: read-only, as with client-go's informers. Only
`metadata.managedFields` is dropped on the way in (a third of a pod's size, never read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden.constants import LABEL_DEPLOYMENT
from pdwarden.k8s import selectors

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
# (api_version, kind) of what the cache holds.
CACHED_KINDS: Final = (("v1", "Pod"), ("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"))
# Deletions remembered per kind (a few hours of a fleet's churn); a deletion with no readable
# version blocks every later echo of our writes for that name until the watch adds it again.
MAX_TOMBSTONES: Final = 4096
_NEVER: Final = 1 << 62


def trimmed(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return obj


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _owner(obj: Mapping[str, Any], label: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
    return value if isinstance(value, str) else None


def _rv(obj: Mapping[str, Any] | None) -> int | None:
    """The resourceVersion as a number, where the API server's is one (etcd's are); None
    otherwise, and then writes are never folded in (the watch alone keeps the cache)."""
    raw = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


@dataclass
class _Kind:
    objects: dict[Key, Obj] = field(default_factory=dict)
    # (namespace, deployment label value) -> names: a deployment's children without a scan.
    by_owner: dict[Key, set[str]] = field(default_factory=dict)
    synced: set[str] = field(default_factory=set)  # scopes listed at least once ("" = all)
    deleted: dict[Key, int] = field(default_factory=dict)  # key -> resourceVersion of deletion


class ObjectCache:
    """Objects of the cached kinds that carry `label`, per kind; mutated only on the event
    loop (the watch threads hand their events over with `call_soon_threadsafe`)."""

    def __init__(self, label: str = LABEL_DEPLOYMENT, namespaces: Iterable[str] = ()) -> None:
        self.label = label
        # Scopes the watches cover: "" (the whole cluster) or the listed namespaces.
        self.scopes = tuple(namespaces) or ("",)
        self._kinds = {kind: _Kind() for _, kind in CACHED_KINDS}
        self._versions: dict[Key, int] = {}
        self._waiters: dict[Key, asyncio.Event] = {}
        self.events = 0  # watch events applied (a progress counter for tests and benches)

    # -- fed by the watches ----------------------------------------------------------------

    def replace(self, kind: str, scope: str, objs: Iterable[Obj]) -> None:
        """A fresh LIST of `kind` in `scope` ("" = every namespace): it replaces what was held."""
        k = self._kinds[kind]
        fresh = {_key(o): trimmed(o) for o in objs}
        for key in [key for key in k.objects if not scope or key[0] == scope]:
            if key not in fresh:
                self._drop(kind, key)
                self._tombstone(kind, key, None)  # deleted at a version we were not told
        for obj in fresh.values():
            self._put(kind, obj)
        k.synced.add(scope)

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        self.events += 1
        if event == "DELETED":
            self._drop(kind, _key(obj))
            self._tombstone(kind, _key(obj), _rv(obj))
        else:
            self._put(kind, trimmed(obj))

    def written(self, kind: str, obj: Obj) -> None:
        """An object the API server returned for our own write: folded in at once when it is
        newer than what is held (or than its deletion, when the watch already saw one), so the
        next pass does not repeat the write before the watch delivers it. A created object
        counts too: without it every new deployment was applied twice (bench/fleet.py saw the
        second apply ~2 s after the first, doubling the create cost)."""
        k = self._kinds.get(kind)
        key = _key(obj)
        if k is None or not self.synced(kind, key[0]):
            return
        held = k.objects.get(key)
        new = _rv(obj)
        old = _rv(held) if held is not None else k.deleted.get(key, 0)
        if new is not None and old is not None and new > old:
            self._put(kind, trimmed(dict(obj)))

    def _put(self, kind: str, obj: Obj) -> None:
        k = self._kinds[kind]
        key = _key(obj)
        old = k.objects.get(key)
        if old is not None:
            self._unindex(k, key, old)
        k.objects[key] = obj
        owner = _owner(obj, self.label)
        if owner is not None:
            k.by_owner.setdefault((key[0], owner), set()).add(key[1])
            self._bump((key[0], owner))

    def _tombstone(self, kind: str, key: Key, rv: int | None) -> None:
        """Remember a deletion's version, so a late echo of our own write cannot resurrect the
        object; bounded, oldest forgotten first."""
        deleted = self._kinds[kind].deleted
        deleted.pop(key, None)
        deleted[key] = rv if rv is not None else _NEVER
        while len(deleted) > MAX_TOMBSTONES:
            del deleted[next(iter(deleted))]

    def _drop(self, kind: str, key: Key) -> None:
        k = self._kinds[kind]
        old = k.objects.pop(key, None)
        if old is not None:
            self._unindex(k, key, old)

    def _unindex(self, k: _Kind, key: Key, old: Obj) -> None:
        owner = _owner(old, self.label)
        if owner is None:
            return
        names = k.by_owner.get((key[0], owner))
        if names is not None:
            names.discard(key[1])
            if not names:
                del k.by_owner[(key[0], owner)]
        self._bump((key[0], owner))

    def _bump(self, deployment: Key) -> None:
        self._versions[deployment] = self._versions.get(deployment, 0) + 1
        waiter = self._waiters.pop(deployment, None)
        if waiter is not None:
            waiter.set()

    # -- read by the shells ----------------------------------------------------------------

    def synced(self, kind: str, namespace: str) -> bool:
        k = self._kinds.get(kind)
        return k is not None and ("" in k.synced or namespace in k.synced)

    def select(self, kind: str, namespace: str, selector: str) -> list[Obj] | None:
        """The objects `list` would return, or None when the cache cannot say exactly: not a
        cached kind, not listed yet, or a selector that does not pin the deployment label
        (only labelled objects are held)."""
        if not namespace or not self.synced(kind, namespace):
            return None
        parsed = selectors.parse(selector)
        owner = parsed.equals(self.label) if parsed is not None else None
        if parsed is None or owner is None:
            return None
        k = self._kinds[kind]
        names = sorted(k.by_owner.get((namespace, owner), ()))
        found = (k.objects[(namespace, n)] for n in names)
        return [o for o in found if parsed.matches((o.get("metadata") or {}).get("labels"))]

    def version(self, namespace: str, deployment: str) -> int:
        """Changes seen so far to the children of one deployment (any kind)."""
        return self._versions.get((namespace, deployment), 0)

    async def wait_change(
        self, namespace: str, deployment: str, since: int, seconds: float
    ) -> bool:
        """Until a child of the deployment changed after `since` (True) or `seconds` passed
        (False)."""
        key = (namespace, deployment)
        if self.version(*key) != since:
            return True
        waiter = self._waiters.setdefault(key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), seconds)
        return self.version(*key) != since

    def size(self) -> dict[str, int]:
        return {kind: len(k.objects) for kind, k in self._kinds.items()}
