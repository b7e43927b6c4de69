"""`KubeApi` with `list` answered from the watch cache: the shells' port, unchanged.

Why a wrapper: the reconcile and remediation shells speak only `pdwarden.ports.KubeApi`; wrapping
the real client here gives them watch-served lists without a line of theirs changing, and tests
that hand them an in-memory fake keep working as before. Every other verb goes to the API
server; the answers to our own writes of cached kinds are folded into the cache at once
(`ObjectCache.written`), so a pass right after a write does not repeat it.

`Watches` starts one `Watcher` per cached kind and scope and feeds the cache on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from pdwarden.k8s.cache import CACHED_KINDS, ObjectCache
from pdwarden.k8s.client import KubeClient
from pdwarden.k8s.watching import Batch, Watcher, WatchTarget

log = logging.getLogger("pdwarden.k8s.cached")
Obj = dict[str, Any]
_API_VERSION = dict((kind, version) for version, kind in CACHED_KINDS)


@dataclass
class Watches:
    """The watches that keep `cache` current (the deployment label must exist on an object)."""

    api: k8s.ApiClient
    cache: ObjectCache
    watchers: list[Watcher] = field(default_factory=list)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for api_version, kind in CACHED_KINDS:
            for scope in self.cache.scopes:
                target = WatchTarget(api_version, kind, scope, self.cache.label)
                watcher = Watcher(self.api, target, self._deliver, loop)
                self.watchers.append(watcher)
                watcher.start()

    def _deliver(self, target: WatchTarget, batch: Batch) -> None:
        for event, obj in batch:
            if event == "SYNC":
                self.cache.replace(target.kind, target.namespace, obj["items"])
            else:
                self.cache.apply(target.kind, event, obj)

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def stats(self) -> dict[str, int]:
        return {
            "lists": sum(w.lists for w in self.watchers),
            "watches": sum(w.watches for w in self.watchers),
        }


class CachedKube:
    """A `KubeApi` over `api` whose `list` of cached kinds is served by `cache` when it can."""

    def __init__(self, api: KubeClient, cache: ObjectCache) -> None:
        self.api = api
        self.cache = cache
        self.served = 0  # lists answered from memory
        self.passed = 0  # lists that went to the API server

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str
    ) -> list[Obj]:
        if _API_VERSION.get(kind) == api_version:
            found = self.cache.select(kind, namespace, label_selector)
            if found is not None:
                self.served += 1
                return found
        self.passed += 1
        return await self.api.list(api_version, kind, namespace, label_selector)

    async def apply(self, obj: Obj, field_manager: str) -> Obj:
        out = await self.api.apply(obj, field_manager)
        self.cache.written(str(obj.get("kind")), out)
        return out

    async def create(self, obj: Obj) -> Obj | None:
        return await self.api.create(obj)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        return await self.api.get(api_version, kind, namespace, name)

    async def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        status: Obj,
        *,
        resource_version: str | None = None,
    ) -> Obj:
        return await self.api.patch_status(
            api_version, kind, namespace, name, status, resource_version=resource_version
        )

    async def patch_metadata(
        self, api_version: str, kind: str, namespace: str, name: str, metadata: Obj
    ) -> Obj:
        return await self.api.patch_metadata(api_version, kind, namespace, name, metadata)

    async def set_pod_condition(self, namespace: str, name: str, condition: Obj) -> Obj:
        out = await self.api.set_pod_condition(namespace, name, condition)
        self.cache.written("Pod", out)
        return out

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        return await self.api.delete_pod(namespace, name, uid)

    async def create_event(self, event: Obj) -> None:
        await self.api.create_event(event)
