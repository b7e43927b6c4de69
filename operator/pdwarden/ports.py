"""The seams of the operator's shells: what they need from Kubernetes and from worker pods.

Why: `reconciling`, `remediation` and `handlers` are the code that runs during incidents, so they
must be testable without a cluster. They depend on these Protocols, which `k8s.KubeClient`,
`k8s.foreign.ForeignPods`, `remediation.scrape.worker_client.WorkerClient`, the `remediation.act`
clients and `remediation.confirm.canary.Canary` satisfy in production and in-memory fakes
satisfy in tests (tests/shell), with failures injected at will. The values they carry live
below, in `values`; nothing here does I/O, and nothing here imports a layer above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pdwarden.values import (
    CanaryResult,
    EvictionOutcome,
    LabelPatch,
    PairCanary,
    PairResult,
    ScrapeResult,
    ScreenView,
    Target,
)

Obj = dict[str, Any]


class KubeApi(Protocol):
    """The verbs the shells use; errors are `k8s.ApiError` (status 0 = API server unreachable)."""

    async def apply(self, obj: Obj, field_manager: str) -> Obj: ...

    async def create(self, obj: Obj) -> Obj | None: ...

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str
    ) -> list[Obj]: ...

    async def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        status: Obj,
        *,
        resource_version: str | None = None,
    ) -> Obj: ...

    async def patch_metadata(
        self, api_version: str, kind: str, namespace: str, name: str, metadata: Obj
    ) -> Obj: ...

    async def set_pod_condition(self, namespace: str, name: str, condition: Obj) -> Obj: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool: ...

    async def create_event(self, event: Obj) -> None: ...


class ForeignPodApi(Protocol):
    """What a PDRemediationPolicy does to pods it does not own (k8s.foreign.ForeignPods):
    one label, merge-patched on one incarnation ("Patched", "Conflict" or "Gone"); an eviction
    through the Eviction API (PDBs decide); and reading the selector of the Service in front."""

    async def set_pod_label(self, namespace: str, patch: LabelPatch) -> str: ...

    async def evict_pod(self, namespace: str, name: str, uid: str) -> EvictionOutcome: ...

    async def service_selector(self, namespace: str, name: str) -> dict[str, str] | None: ...


class WorkerApi(Protocol):
    """Reading worker pods: /metrics and pdworker's rooms list, each tenant (a PDDeployment or
    PDRemediationPolicy uid) in its own share of connections and parsing."""

    async def scrape(
        self, targets: Sequence[Target], token: str | None, tenant: str = ""
    ) -> list[ScrapeResult]: ...

    def forget(self, tenant: str) -> None: ...

    async def close(self) -> None: ...


class ScreenApi(Protocol):
    """Prometheus as the fleet's screen (prometheus mode): what its last scrape of each pod
    said, from one query shared by every object of the process. Never raises (but
    cancellation); an unusable answer is the view's `error`."""

    async def look(
        self, namespace: str, targets: Sequence[Target], max_age: float
    ) -> ScreenView: ...

    async def close(self) -> None: ...


class AdminApi(Protocol):
    """The one worker admin call remediation makes: fail rooms by id on a pdworker prefill
    (idempotent); returns how many it failed now."""

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int: ...

    async def close(self) -> None: ...


class PairCanaryApi(Protocol):
    """One pair canary through a prefill and a decode, in the engine's own PD protocol and in
    their tenant's share of connections. Never raises (but cancellation); the outcome says."""

    async def pair(
        self, prefill: Target, decode: Target, canary: PairCanary, tenant: str = "",
        deadline: float = 8.0,
    ) -> PairResult: ...  # fmt: skip


class CanaryApi(Protocol):
    """One canary generation on a vLLM decode pod, in its tenant's share of connections: is
    its engine alive behind its API server? Never raises (but cancellation); the verdict says."""

    async def probe(self, target: Target, tenant: str = "") -> CanaryResult: ...
