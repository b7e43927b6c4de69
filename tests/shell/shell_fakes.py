"""In-memory fakes of the operator's two seams (`pdwarden.ports`): Kubernetes and worker pods.

Why here and not in the package: they exist only for tests and must never become a production
code path. They model what the shells rely on and nothing more: a Kubernetes object store with
resourceVersions (a guarded write that is out of date gets 409, as the API server answers),
merge-patch status writes (lists replaced wholesale, as the real API server does), label
selectors, UID-preconditioned deletes and Events; and worker pods with metrics, rooms and an
admin API that fails rooms; vLLM pods whose prefill lets KV leases expire (`LeaseWorkers`);
and the canary on a vLLM decode (`CanaryFake`). Failures are injected per verb
(`KubeFake.fail`) or per pod (`WorkerFake.raises`, `CanaryFake.verdicts`), so each test says
exactly what goes wrong.
"""

from __future__ import annotations

import copy
import itertools
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdwarden.constants import API_VERSION, CONDITION_SERVING, KIND, LABEL_DEPLOYMENT, LABEL_ROLE
from pdwarden.k8s import ApiError
from pdwarden.values import CanaryResult, CanaryVerdict, RoomView, Sample, ScrapeResult, Target

Obj = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, None deletes, everything else (lists) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _matches(obj: Obj, selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


@dataclass
class KubeFake:
    """An API server in a dict. `fail[verb]` holds what the next calls of that verb do, one per
    call in order: raise the exception, or (None) succeed; `down` makes every call raise it (API
    server unreachable)."""

    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    events: list[Obj] = field(default_factory=list)
    fail: dict[str, list[BaseException | None]] = field(default_factory=lambda: defaultdict(list))
    down: BaseException | None = None
    calls: Counter[str] = field(default_factory=Counter)  # calls made, by verb
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- test helpers ---------------------------------------------------------------------

    def put(self, obj: Obj) -> Obj:
        """Store `obj` as the API server would (uid, resourceVersion, generation)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
        return copy.deepcopy(obj)

    def obj(self, kind: str, namespace: str, name: str) -> Obj:
        return copy.deepcopy(self.objects[(kind, namespace, name)])

    def kinds(self, kind: str) -> list[Obj]:
        return [copy.deepcopy(o) for (k, _, _), o in self.objects.items() if k == kind]

    def _enter(self, verb: str) -> None:
        self.calls[verb] += 1
        if self.down is not None:
            raise self.down
        if self.fail[verb] and (error := self.fail[verb].pop(0)) is not None:
            raise error

    def _bump(self, obj: Obj) -> Obj:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    # -- pdwarden.ports.KubeApi -----------------------------------------------------------

    async def apply(self, obj: Obj, field_manager: str) -> Obj:
        self._enter("apply")
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        current = self.objects.get(key)
        if current is None:
            return self.put(obj)
        merged = merge_patch(current, {k: v for k, v in obj.items() if k != "status"})
        merged["metadata"]["generation"] = current["metadata"].get("generation", 1) + (
            merged.get("spec") != current.get("spec")
        )
        self.objects[key] = merged
        return self._bump(merged)

    async def create(self, obj: Obj) -> Obj | None:
        self._enter("create")
        meta = obj["metadata"]
        if (obj["kind"], meta.get("namespace", ""), meta["name"]) in self.objects:
            return None
        return self.put(obj)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self._enter("get")
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str
    ) -> list[Obj]:
        self._enter("list")
        return [  # as the API server lists them: items carry no kind or apiVersion
            {k_: v for k_, v in copy.deepcopy(o).items() if k_ not in ("kind", "apiVersion")}
            for (k, ns, _), o in self.objects.items()
            if k == kind and ns == namespace and _matches(o, label_selector)
        ]

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
        self._enter("patch_status")
        current = self.objects.get((kind, namespace, name))
        if current is None:
            raise ApiError(404, f"{kind} {name} not found")
        if (
            resource_version is not None
            and resource_version != current["metadata"]["resourceVersion"]
        ):
            raise ApiError(409, "the object has been modified; please apply your changes")
        current["status"] = merge_patch(current.get("status") or {}, status)
        return self._bump(current)

    async def patch_metadata(
        self, api_version: str, kind: str, namespace: str, name: str, metadata: Obj
    ) -> Obj:
        self._enter("patch_metadata")
        current = self.objects[(kind, namespace, name)]
        current["metadata"] = merge_patch(current["metadata"], metadata)
        return self._bump(current)

    async def set_pod_condition(self, namespace: str, name: str, condition: Obj) -> Obj:
        self._enter("set_pod_condition")
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None:
            raise ApiError(404, f"pods {name} not found")
        st = pod.setdefault("status", {})
        st["conditions"] = [
            c for c in st.get("conditions") or [] if c["type"] != condition["type"]
        ] + [dict(condition)]
        return self._bump(pod)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        self._enter("delete_pod")
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return False
        del self.objects[("Pod", namespace, name)]
        return True

    async def create_event(self, event: Obj) -> None:
        self._enter("create_event")
        name = event["metadata"]["name"]
        if any(e["metadata"]["name"] == name for e in self.events):
            raise ApiError(409, f'events "{name}" already exists')
        self.events.append(copy.deepcopy(event))


# -- a PDDeployment with its StatefulSets and pods, as the cluster would hold them ----------


def pddeployment(
    kube: KubeFake, name: str = "pd", namespace: str = "ns", **remediation: Any
) -> Obj:
    spec = {
        "image": "pdwarden/pdworker:dev",
        "model": {"name": "tiny"},
        "prefill": {"replicas": 2, "gpus": 0},
        "decode": {"replicas": 2, "gpus": 0},
        "remediation": {
            "scrapeIntervalSeconds": 1,
            "wedgeAfterSeconds": 10,
            "restartAfterSeconds": 10,
            "cooldownSeconds": 0,
            "maxUnavailableDecode": 1,
            **remediation,
        },
    }
    return kube.put(
        {"apiVersion": API_VERSION, "kind": KIND,
         "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )  # fmt: skip


def workload(kube: KubeFake, owner: Obj, role: str, replicas: int) -> Obj:
    meta = owner["metadata"]
    return kube.put(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": f"{meta['name']}-{role}",
                "namespace": meta["namespace"],
                "labels": {LABEL_DEPLOYMENT: meta["name"], LABEL_ROLE: role},
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                     "uid": meta["uid"], "controller": True}
                ],
            },
            "spec": {"replicas": replicas},
        }
    )  # fmt: skip


def pod(
    kube: KubeFake, sts: Obj | None, name: str, role: str, ip: str, *, deployment: str = "pd",
    namespace: str = "ns", ready: bool = True,
) -> Obj:  # fmt: skip
    """A running worker pod; `sts=None` makes a look-alike with our labels and no owner."""
    refs = []
    if sts is not None:
        refs = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                 "uid": sts["metadata"]["uid"], "controller": True}]  # fmt: skip
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return kube.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "ownerReferences": refs,
                "labels": {LABEL_DEPLOYMENT: deployment, LABEL_ROLE: role},
            },
            "status": {"phase": "Running", "podIP": ip, "conditions": conditions},
        }
    )  # fmt: skip


def fake_ip(pod_name: str) -> str:
    """The IP `cluster` gives a pod: pd-prefill-i is 127.0.1.(i+1), pd-decode-i 127.0.2.(i+1)."""
    role, _, index = pod_name.rpartition("-")
    return f"127.0.{2 if role.endswith('decode') else 1}.{int(index) + 1}"


def cluster(kube: KubeFake, prefill: int = 2, decode: int = 2, **remediation: Any) -> Obj:
    """A PDDeployment `ns/pd` with prefill pods pd-prefill-i (127.0.1.i) and decode pods
    pd-decode-i (127.0.2.i), each owned by its StatefulSet; returns the PDDeployment."""
    pdd = pddeployment(kube, **remediation)
    for role, n, net in (("prefill", prefill, 1), ("decode", decode, 2)):
        sts = workload(kube, pdd, role, n)
        for i in range(n):
            pod(kube, sts, f"pd-{role}-{i}", role, f"127.0.{net}.{i + 1}")
    for i in range(decode):
        kube.objects[("Pod", "ns", f"pd-decode-{i}")]["status"]["conditions"].append(
            {"type": CONDITION_SERVING, "status": "True"}
        )
    return kube.obj(KIND, "ns", "pd")


# -- worker pods ----------------------------------------------------------------------------


@dataclass
class WorkerFake:
    """Worker pods by name: what /metrics and /admin/rooms answer, and what fail_rooms does.

    `rooms[pod]` are the pod's live rooms; `raises[pod]` an exception its scrape raises;
    `fail_raises[pod]` one its fail-rooms call raises. `tokens[pod]` records every token a pod
    was sent (scrape or admin call), `failed[pod]` every room it was told to fail.
    """

    incarnations: dict[str, str] = field(default_factory=dict)
    rooms: dict[str, list[RoomView]] = field(default_factory=lambda: defaultdict(list))
    raises: dict[str, BaseException] = field(default_factory=dict)
    fail_raises: dict[str, BaseException] = field(default_factory=dict)
    tokens: dict[str, list[str | None]] = field(default_factory=lambda: defaultdict(list))
    failed: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    scraped: list[str] = field(default_factory=list)

    def stuck(self, prefill: str, decode: str, *rooms: int, seconds: float = 30.0) -> None:
        """Rooms of `prefill` stuck in its inflight queue, waiting on `decode`."""
        self.rooms[prefill] += [
            RoomView(r, "inflight", seconds, decode, self.incarnation(decode), fake_ip(decode))
            for r in rooms
        ]

    def incarnation(self, pod: str) -> str:
        return self.incarnations.setdefault(pod, f"inc-{pod}")

    def _sample(self, target: Target) -> Sample:
        live = self.rooms.get(target.pod, [])
        inc = self.incarnation(target.pod)
        if target.role == "prefill":
            return Sample(
                at=time.monotonic(), bootstrap_queue=0.0, inflight_queue=float(len(live)),
                incarnation=inc,
            )  # fmt: skip
        return Sample(
            at=time.monotonic(), prealloc_queue=0.0, transfer_queue=0.0, running=0.0,
            generated_tokens=0.0, incarnation=inc,
        )  # fmt: skip

    async def scrape(
        self, targets: Sequence[Target], token: str | None, tenant: str = ""
    ) -> list[ScrapeResult]:
        out = []
        for t in targets:
            self.scraped.append(t.pod)
            self.tokens[t.pod].append(token)
            if t.pod in self.raises:
                raise self.raises[t.pod]
            rooms = tuple(self.rooms.get(t.pod, [])) if t.rooms else None
            out.append(ScrapeResult(t, self._sample(t), rooms))
        return out

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int:
        self.tokens[target.pod].append(token)
        if target.pod in self.fail_raises:
            raise self.fail_raises[target.pod]
        live = self.rooms.get(target.pod, [])
        hit = [r for r in live if r.room in set(rooms)]
        self.rooms[target.pod] = [r for r in live if r.room not in set(rooms)]
        self.failed[target.pod] += [r.room for r in hit]
        return len(hit)

    def forget(self, tenant: str) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class LeaseWorkers(WorkerFake):
    """vLLM pods as their /metrics look: a prefill in `expiring` frees one more request's KV
    unread at every scrape (vllm:nixl_num_kv_expired_reqs_total rises: LeaseExpired); a decode
    in `generating` moves its token counter every scrape, the others stay idle and flat (as a
    decode frozen behind its live API server does)."""

    expiring: set[str] = field(default_factory=set)
    generating: set[str] = field(default_factory=set)
    _scrapes: Counter[str] = field(default_factory=Counter)

    def _sample(self, target: Target) -> Sample:
        self._scrapes[target.pod] += 1
        n = float(self._scrapes[target.pod])
        if target.role == "prefill":
            return Sample(
                at=time.monotonic(), running=0.0, waiting_queue=0.0, prefill_tokens=500.0,
                kv_expired=n if target.pod in self.expiring else 0.0, late_notifications=0.0,
            )  # fmt: skip
        return Sample(
            at=time.monotonic(), running=0.0, waiting_queue=0.0, reading_queue=0.0,
            generated_tokens=10.0 * n if target.pod in self.generating else 100.0,
        )  # fmt: skip


@dataclass
class CanaryFake:
    """ports.CanaryApi: `verdicts[pod]` is what a canary on that pod finds (alive when unset);
    `raises[pod]` an exception it raises instead; `asked` every (pod, address, tenant) asked."""

    verdicts: dict[str, CanaryVerdict] = field(default_factory=dict)
    raises: dict[str, BaseException] = field(default_factory=dict)
    asked: list[tuple[str, str, str]] = field(default_factory=list)
    deadline: float = 30.0

    async def probe(self, target: Target, tenant: str = "") -> CanaryResult:
        self.asked.append((target.pod, target.base, tenant))
        if target.pod in self.raises:
            raise self.raises[target.pod]
        verdict = self.verdicts.get(target.pod, "alive")
        detail = {
            "alive": "a token in 0.1s",
            "dead": f"no token within {self.deadline:g}s while its API server answers /v1/models",
            "unknown": "GET /v1/models: HTTP 401",
        }[verdict]
        return CanaryResult(target.pod, verdict, detail)
