"""Whole PDRemediationPolicy cycles in-process: the real policy shell over fakes.

`KubeFake` and `WorkerFake` (shell_fakes.py) stand in for the API server and the worker pods;
`ForeignFake` below for the label patch and the Eviction API (k8s/foreign.py, whose behaviour
against a real API server is checked in tests/operator/test_foreign_cluster.py). The pods belong
to StatefulSets, not to pdwarden. Each test asserts what a user would see: the policy's status
(ledger, conditions, held back, refused), pod labels, pods evicted, rooms failed, Events.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from shell_fakes import CanaryFake, KubeFake, LeaseWorkers, WorkerFake

from pdwarden.constants import (
    ANNOTATION_RESET_BREAKER,
    API_VERSION,
    LABEL_DEPLOYMENT,
    LABEL_SERVING,
    POLICY_KIND,
    WORKER_PORT,
)
from pdwarden.handlers.on_policy import PolicyState, policy_cycle
from pdwarden.k8s import ApiError
from pdwarden.remediation.memory import DeploymentMemory, PodMemory
from pdwarden.values import EvictionOutcome, LabelPatch, Sample, ScrapeResult, Target

TOKEN = "policy-admin-token"
PDB_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


@dataclass
class ForeignFake:
    """ports.ForeignPodApi over a KubeFake, with the API server's guards (uid, resourceVersion)
    and a PodDisruptionBudget that refuses every eviction while `pdb_refuses` is set."""

    kube: KubeFake
    pdb_refuses: bool = False
    evicted: list[str] = field(default_factory=list)

    async def set_pod_label(self, namespace: str, patch: LabelPatch) -> str:
        pod = self.kube.objects.get(("Pod", namespace, patch.pod))
        if pod is None:
            return "Gone"
        meta = pod["metadata"]
        if meta["uid"] != patch.uid or meta["resourceVersion"] != patch.resource_version:
            return "Conflict"
        meta.setdefault("labels", {})[patch.key] = patch.value
        self.kube._bump(pod)
        return "Patched"

    async def evict_pod(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        if self.pdb_refuses:
            return EvictionOutcome("HeldBack", f"PodDisruptionBudget: {PDB_REFUSAL}")
        pod = self.kube.objects.get(("Pod", namespace, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return EvictionOutcome("Gone", "not found")
        del self.kube.objects[("Pod", namespace, name)]
        self.evicted.append(name)
        return EvictionOutcome("Evicted", "")

    async def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        svc = self.kube.objects.get(("Service", namespace, name))
        return None if svc is None else dict(svc["spec"].get("selector") or {})


@dataclass
class StallingWorkers(WorkerFake):
    """WorkerFake whose decode pods in `stalled` hold running requests and generate nothing."""

    stalled: set[str] = field(default_factory=set)

    def _sample(self, target: Target) -> Sample:
        if target.pod in self.stalled:
            return stalled_sample(time.monotonic(), self.incarnation(target.pod))
        return super()._sample(target)

    async def scrape(
        self, targets: Sequence[Target], token: str | None, tenant: str = ""
    ) -> list[ScrapeResult]:
        assert all(t.port == WORKER_PORT and t.metrics_path == "/metrics" for t in targets)
        return await super().scrape(targets, token, tenant)


def stalled_sample(at: float, incarnation: str) -> Sample:
    return Sample(
        at=at, prealloc_queue=0.0, transfer_queue=0.0, running=2.0, generated_tokens=5.0,
        incarnation=incarnation,
    )  # fmt: skip


def sts(kube: KubeFake, role: str) -> dict[str, Any]:
    return kube.put({"apiVersion": "apps/v1", "kind": "StatefulSet",
                     "metadata": {"name": f"sgl-{role}", "namespace": "ns"},
                     "spec": {"replicas": 2}})  # fmt: skip


def foreign_pods(kube: KubeFake, decode: int = 3) -> None:
    """StatefulSet-owned pods sgl-prefill-0..1 and sgl-decode-0..n-1, IPs as shell_fakes.fake_ip
    gives them; decode pods carry the serving label the Service selects."""
    for role, n, net in (("prefill", 2, 1), ("decode", decode, 2)):
        owner = sts(kube, role)
        for i in range(n):
            labels = {"app": "sgl", "role": role}
            if role == "decode":
                labels[LABEL_SERVING] = "true"
            kube.put({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"sgl-{role}-{i}", "namespace": "ns", "labels": labels,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                  "name": owner["metadata"]["name"],
                                                  "uid": owner["metadata"]["uid"],
                                                  "controller": True}]},
                "status": {"phase": "Running", "podIP": f"127.0.{net}.{i + 1}",
                           "conditions": [{"type": "Ready", "status": "True"}]},
            })  # fmt: skip
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "sgl-decode", "namespace": "ns"},
            "spec": {"selector": {"app": "sgl", "role": "decode", LABEL_SERVING: "true"}},
        }
    )
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sgl-admin", "namespace": "ns"},
            "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
        }
    )


def policy(kube: KubeFake, name: str = "sgl", mode: str = "Enforce", **over: Any) -> None:
    spec = {
        "engine": "pdworker",
        "prefillSelector": {"matchLabels": {"app": "sgl", "role": "prefill"}},
        "decodeSelector": {"matchLabels": {"app": "sgl", "role": "decode"}},
        "metrics": {"port": WORKER_PORT},
        "remediation": {"mode": mode, "scrapeIntervalSeconds": 1, "wedgeAfterSeconds": 10,
                        "restartAfterSeconds": 10, "cooldownSeconds": 0,
                        "maxUnavailableDecode": 1},
        "cordon": {"serviceRef": {"name": "sgl-decode"}},
        "adminTokenSecretRef": {"name": "sgl-admin", "key": "token"},
        **over,
    }  # fmt: skip
    kube.put({"apiVersion": API_VERSION, "kind": POLICY_KIND,
              "metadata": {"name": name, "namespace": "ns"}, "spec": spec})  # fmt: skip


def ago(seconds: float) -> str:
    t = (datetime.now(UTC) - timedelta(seconds=seconds)).replace(microsecond=0)
    return t.isoformat().replace("+00:00", "Z")


def history_entry(action: str, pod: str, seconds_ago: float, **more: Any) -> dict[str, Any]:
    return {"time": ago(seconds_ago), "action": action, "pod": pod, "rooms": 1,
            "reason": "earlier", **more}  # fmt: skip


@pytest.fixture
def kube() -> KubeFake:
    k = KubeFake()
    foreign_pods(k)
    return k


@pytest.fixture
def workers() -> StallingWorkers:
    return StallingWorkers()


def make_state(kube: KubeFake, workers: WorkerFake) -> tuple[PolicyState, ForeignFake]:
    foreign = ForeignFake(kube)
    return PolicyState(client=kube, workers=workers, admin=workers, foreign=foreign), foreign


def cycle(state: PolicyState, kube: KubeFake, name: str = "sgl") -> None:
    before = state.cycles[kube.obj(POLICY_KIND, "ns", name)["metadata"]["uid"]]
    asyncio.run(policy_cycle(state, kube.obj(POLICY_KIND, "ns", name)))
    assert state.cycles[kube.obj(POLICY_KIND, "ns", name)["metadata"]["uid"]] == before + 1


def status(kube: KubeFake, name: str = "sgl") -> dict[str, Any]:
    return dict(kube.obj(POLICY_KIND, "ns", name).get("status") or {})


def ledger(kube: KubeFake, name: str = "sgl") -> list[tuple[str, str, str, bool]]:
    hist = (status(kube, name).get("remediation") or {}).get("history") or []
    return [(e["action"], e["pod"], e.get("outcome", "Succeeded"), e.get("dryRun", False))
            for e in hist]  # fmt: skip


def condition(kube: KubeFake, type_: str, name: str = "sgl") -> dict[str, Any]:
    return next(c for c in status(kube, name).get("conditions", []) if c["type"] == type_)


def label(kube: KubeFake, pod: str) -> str | None:
    labels: dict[str, str] = kube.obj("Pod", "ns", pod)["metadata"]["labels"]
    return labels.get(LABEL_SERVING)


def repeat_offender(kube: KubeFake, name: str = "sgl", dry_run: bool = False) -> None:
    """sgl-decode-1's rooms were failed 5 s ago; they wedge again, so it is to be cordoned."""
    earlier = history_entry("FailRooms", "sgl-prefill-0", 5, peer="sgl-decode-1", dryRun=dry_run)
    kube.objects[(POLICY_KIND, "ns", name)]["status"] = {"remediation": {"history": [earlier]}}


def test_dry_run_reports_and_does_nothing(kube: KubeFake, workers: StallingWorkers) -> None:
    policy(kube, mode="DryRun")
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, foreign = make_state(kube, workers)
    cycle(state, kube)
    assert ledger(kube) == [("FailRooms", "sgl-prefill-0", "Succeeded", True)]
    assert workers.failed == {} and foreign.evicted == []
    assert label(kube, "sgl-decode-1") == "true"
    st = status(kube)
    assert st["prefill"]["matched"] == 2 and st["decode"]["matched"] == 3
    assert st["wedgedRooms"] == 1 and st["remediation"]["actionsLastHour"] == 1
    assert condition(kube, "Wedged")["status"] == "True"
    assert condition(kube, "CordonUnavailable")["status"] == "False"
    reasons = [e["reason"] for e in kube.events]
    assert {"WedgeDetected", "DryRunFailRooms"} <= set(reasons)
    pods_told = {e["involvedObject"]["name"] for e in kube.events
                 if e["involvedObject"]["kind"] == "Pod"}  # fmt: skip
    assert pods_told == {"sgl-prefill-0"}


def test_enforce_fails_rooms_with_the_secret_token_and_cordons_by_label(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    policy(kube)
    repeat_offender(kube)
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, _ = make_state(kube, workers)
    cycle(state, kube)
    assert ledger(kube)[1:] == [
        ("FailRooms", "sgl-prefill-0", "Succeeded", False),
        ("CordonDecode", "sgl-decode-1", "Succeeded", False),
    ]
    assert workers.failed["sgl-prefill-0"] == [7]
    assert TOKEN in workers.tokens["sgl-prefill-0"]
    assert label(kube, "sgl-decode-1") == "false"
    # the next cycle sees the label (the Service no longer selects the pod); the decode is not
    # stalled, but it has not been healthy for a full window yet: it stays cordoned
    cycle(state, kube)
    assert label(kube, "sgl-decode-1") == "false"
    assert status(kube)["decode"]["cordoned"] == 1
    assert status(kube)["remediation"]["cordoned"][0]["pod"] == "sgl-decode-1"


def test_uncordon_after_a_healthy_window(kube: KubeFake, workers: StallingWorkers) -> None:
    policy(kube)
    kube.objects[("Pod", "ns", "sgl-decode-1")]["metadata"]["labels"][LABEL_SERVING] = "false"
    kube.objects[(POLICY_KIND, "ns", "sgl")]["status"] = {"remediation": {"history": [
        history_entry("CordonDecode", "sgl-decode-1", 30)]}}  # fmt: skip
    state, _ = make_state(kube, workers)
    # a full healthy window already observed: idle, nothing queued
    idle = workers._sample(Target("sgl-decode-1", "", "decode", "127.0.2.2"))
    seed(
        state, kube, "sgl-decode-1", [replace(idle, at=idle.at - 12), replace(idle, at=idle.at - 6)]
    )
    cycle(state, kube)
    assert ledger(kube)[-1][:3] == ("UncordonDecode", "sgl-decode-1", "Succeeded")
    assert label(kube, "sgl-decode-1") == "true"


def _stalled_and_cordoned(kube: KubeFake, workers: StallingWorkers, state: PolicyState) -> None:
    """sgl-decode-1 was cordoned 30 s ago and has been stalled for a full window since."""
    kube.objects[("Pod", "ns", "sgl-decode-1")]["metadata"]["labels"][LABEL_SERVING] = "false"
    kube.objects[(POLICY_KIND, "ns", "sgl")]["status"] = {"remediation": {"history": [
        history_entry("CordonDecode", "sgl-decode-1", 30)]}}  # fmt: skip
    workers.stalled.add("sgl-decode-1")
    now = time.monotonic()
    inc = workers.incarnation("sgl-decode-1")
    seed(state, kube, "sgl-decode-1", [stalled_sample(now - 12, inc), stalled_sample(now - 6, inc)])


def seed(state: PolicyState, kube: KubeFake, pod: str, samples: list[Sample]) -> None:
    """Earlier cycles' samples of `pod`, as the policy's memory would hold them."""
    uid = kube.obj("Pod", "ns", pod)["metadata"]["uid"]
    policy_uid = kube.obj(POLICY_KIND, "ns", "sgl")["metadata"]["uid"]
    mem = state.memory.setdefault(policy_uid, DeploymentMemory())
    mem.pods[uid] = PodMemory(samples=deque(samples), last_ok=samples[-1].at)


def test_enforce_evicts_a_stalled_cordoned_decode(kube: KubeFake, workers: StallingWorkers) -> None:
    policy(kube)
    state, foreign = make_state(kube, workers)
    _stalled_and_cordoned(kube, workers, state)
    cycle(state, kube)
    assert foreign.evicted == ["sgl-decode-1"]
    assert ledger(kube)[-1][:3] == ("RestartDecode", "sgl-decode-1", "Succeeded")
    assert "RestartDecode" in [e["reason"] for e in kube.events]


def test_a_pdb_that_forbids_the_eviction_is_honoured(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    policy(kube)
    state, foreign = make_state(kube, workers)
    foreign.pdb_refuses = True
    _stalled_and_cordoned(kube, workers, state)
    cycle(state, kube)
    assert foreign.evicted == []
    assert ledger(kube)[-1][:3] == ("RestartDecode", "sgl-decode-1", "Skipped")
    held = status(kube)["heldBack"]
    assert [(h["action"], h["pod"]) for h in held] == [("RestartDecode", "sgl-decode-1")]
    assert PDB_REFUSAL in held[0]["reason"]
    # Skipped is not counted by the breaker
    assert status(kube)["remediation"]["actionsLastHour"] == 1  # the earlier cordon only
    foreign.pdb_refuses = False
    cycle(state, kube)
    assert foreign.evicted == ["sgl-decode-1"]
    assert status(kube).get("heldBack", []) == []


def test_two_policies_selecting_one_pod_both_refuse_it(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    policy(kube, "a")
    policy(kube, "b", prefillSelector={"matchLabels": {"role": "prefill"}},
           decodeSelector={"matchLabels": {"role": "nothing"}})  # fmt: skip
    repeat_offender(kube, "a")
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, _ = make_state(kube, workers)
    cycle(state, kube, "a")
    cycle(state, kube, "b")
    for name, other in (("a", "b"), ("b", "a")):
        assert condition(kube, "Conflict", name)["status"] == "True"
        refused = status(kube, name)["refused"]
        assert {r["pod"] for r in refused} == {"sgl-prefill-0", "sgl-prefill-1"}
        assert all(r["policies"] == [other] for r in refused)
    assert workers.failed == {}
    assert "sgl-prefill-0" not in workers.scraped
    assert label(kube, "sgl-decode-1") == "true"


def test_a_pdddeployment_pod_is_never_touched(kube: KubeFake, workers: StallingWorkers) -> None:
    kube.objects[("Pod", "ns", "sgl-prefill-0")]["metadata"]["labels"][
        LABEL_DEPLOYMENT] = "pd"  # fmt: skip
    policy(kube)
    repeat_offender(kube)
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, _ = make_state(kube, workers)
    cycle(state, kube)
    assert workers.failed == {} and "sgl-prefill-0" not in workers.scraped
    assert [r["reason"] for r in status(kube)["refused"]] == ["OwnedByPDDeployment"]


def test_no_cordon_when_the_service_does_not_select_the_label(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    kube.objects[("Service", "ns", "sgl-decode")]["spec"]["selector"].pop(LABEL_SERVING)
    policy(kube)
    repeat_offender(kube)
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, _ = make_state(kube, workers)
    cycle(state, kube)
    assert [a for a, *_ in ledger(kube)[1:]] == ["FailRooms"]
    assert label(kube, "sgl-decode-1") == "true"
    unavailable = condition(kube, "CordonUnavailable")
    assert unavailable["status"] == "True" and unavailable["reason"] == "SelectorMissingLabel"
    assert "CordonDecode sgl-decode-1" in condition(kube, "RemediationSuspended")["message"]


def test_a_failed_cycle_is_contained_and_counted(kube: KubeFake, workers: StallingWorkers) -> None:
    policy(kube)
    state, _ = make_state(kube, workers)
    kube.fail["list"].append(ApiError(0, "connection refused"))
    before, cycles_before = errors("policy_cycle"), policy_cycles()
    cycle(state, kube)  # does not raise
    assert errors("policy_cycle") == before + 1
    assert "status" not in kube.obj(POLICY_KIND, "ns", "sgl")
    cycle(state, kube)
    assert status(kube)["decode"]["matched"] == 3
    assert policy_cycles() == cycles_before + 2


def policy_cycles() -> float:
    labels = {"namespace": "ns", "name": "sgl"}
    return REGISTRY.get_sample_value("pdwarden_policy_cycles_total", labels) or 0.0


def errors(stage: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_operator_errors_total", {"stage": stage}) or 0.0


def test_the_breaker_reset_annotation_is_removed_once_the_reset_is_written(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    policy(kube)
    kube.objects[(POLICY_KIND, "ns", "sgl")]["metadata"]["annotations"] = {
        ANNOTATION_RESET_BREAKER: "now"
    }
    state, _ = make_state(kube, workers)
    kube.fail["patch_status"].append(ApiError(503, "unavailable"))
    cycle(state, kube)  # the write failed: the annotation must stay, or the reset is lost
    assert ANNOTATION_RESET_BREAKER in kube.obj(POLICY_KIND, "ns", "sgl")["metadata"]["annotations"]
    cycle(state, kube)
    obj = kube.obj(POLICY_KIND, "ns", "sgl")
    assert ANNOTATION_RESET_BREAKER not in (obj["metadata"].get("annotations") or {})
    assert obj["status"]["remediation"]["breakerResetAt"]


def test_a_policy_in_mode_off_says_so_in_status(kube: KubeFake, workers: StallingWorkers) -> None:
    """Off runs no cycle, but the status says remediation is off (it used to stay empty), and
    what an earlier mode left (wedges, Wedged=True) is no longer claimed."""
    policy(kube, mode="DryRun")
    workers.stuck("sgl-prefill-0", "sgl-decode-1", 7)
    state, foreign = make_state(kube, workers)
    cycle(state, kube)
    assert condition(kube, "Wedged")["status"] == "True"
    kube.objects[(POLICY_KIND, "ns", "sgl")]["spec"]["remediation"]["mode"] = "Off"
    cycle(state, kube)
    off = condition(kube, "RemediationSuspended")
    assert off["status"] == "True" and off["reason"] == "ModeOff"
    assert "Off" in off["message"]
    assert condition(kube, "Ready")["status"] == "False"
    assert condition(kube, "Wedged")["status"] == "Unknown"
    assert status(kube)["wedges"] == [] and status(kube)["wedgedRooms"] == 0
    assert foreign.evicted == [] and workers.failed == {}
    written = kube.obj(POLICY_KIND, "ns", "sgl")["metadata"]["resourceVersion"]
    cycle(state, kube)  # nothing changed: no write
    assert kube.obj(POLICY_KIND, "ns", "sgl")["metadata"]["resourceVersion"] == written
    kube.objects[(POLICY_KIND, "ns", "sgl")]["spec"]["remediation"]["mode"] = "DryRun"
    cycle(state, kube)
    assert condition(kube, "RemediationSuspended")["status"] == "False"
    assert condition(kube, "Ready")["status"] == "True"


def test_an_invalid_policy_says_why_in_status_and_an_event(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    """A spec that slipped past the schema gets Degraded/InvalidSpec with the parser's reason
    and one Warning Event, like a PDDeployment's; fixing it clears Degraded."""
    policy(kube, mode="Enforce", engine="tensorrt-llm")
    state, foreign = make_state(kube, workers)
    cycle(state, kube)
    bad = condition(kube, "Degraded")
    assert bad["status"] == "True" and bad["reason"] == "InvalidSpec"
    assert "engine" in bad["message"]
    assert condition(kube, "Ready")["reason"] == "InvalidSpec"
    cycle(state, kube)
    warnings = [e for e in kube.events if e["reason"] == "InvalidSpec"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert foreign.evicted == [] and workers.failed == {}
    kube.objects[(POLICY_KIND, "ns", "sgl")]["spec"]["engine"] = "pdworker"
    cycle(state, kube)
    fixed = condition(kube, "Degraded")
    assert fixed["status"] == "False" and fixed["reason"] == "SpecValid"
    assert status(kube)["decode"]["matched"] == 3


def test_dry_run_records_a_stalled_decode_once_per_wedge(
    kube: KubeFake, workers: StallingWorkers
) -> None:
    """In DryRun the stalled pod stays stalled after the decided restart; it is recorded (ledger
    and Event) once, not again every restartAfterSeconds."""
    policy(kube, mode="DryRun")
    workers.stalled.add("sgl-decode-1")
    kube.objects[(POLICY_KIND, "ns", "sgl")]["status"] = {"remediation": {"history": [
        history_entry("CordonDecode", "sgl-decode-1", 30, dryRun=True),
        history_entry("RestartDecode", "sgl-decode-1", 15, dryRun=True)]}}  # fmt: skip
    state, foreign = make_state(kube, workers)
    now, inc = time.monotonic(), workers.incarnation("sgl-decode-1")
    seed(state, kube, "sgl-decode-1", [stalled_sample(now - 12, inc), stalled_sample(now - 6, inc)])
    for _ in range(3):
        cycle(state, kube)
    assert ledger(kube) == [
        ("CordonDecode", "sgl-decode-1", "Succeeded", True),
        ("RestartDecode", "sgl-decode-1", "Succeeded", True),
    ]
    assert not [e for e in kube.events if e["reason"].startswith("DryRun")]
    assert label(kube, "sgl-decode-1") == "true" and foreign.evicted == []


def test_vllm_a_dead_lease_suspect_is_cordoned_by_label_though_no_other_decode_serves(
    kube: KubeFake,
) -> None:
    """The policy runs the same confirm stage: sgl-prefill-0's leases expire, sgl-decode-0 is
    the one decode not proven alive and its canary gets no token. The two other decodes are not
    ready, so sgl-decode-0 is the last ready one and the budget (1) is used up: a decode whose
    engine is dead serves nobody, and it is cordoned all the same."""
    policy(kube, engine="vllm")
    for name in ("sgl-decode-1", "sgl-decode-2"):
        kube.objects[("Pod", "ns", name)]["status"]["conditions"] = [
            {"type": "Ready", "status": "False"}
        ]
    workers = LeaseWorkers(expiring={"sgl-prefill-0"}, generating={"sgl-decode-1", "sgl-decode-2"})
    canary = CanaryFake(verdicts={"sgl-decode-0": "dead"})
    state = PolicyState(client=kube, workers=workers, admin=workers, foreign=ForeignFake(kube),
                        canary=canary)  # fmt: skip
    cycle(state, kube)
    cycle(state, kube)
    uid = kube.obj(POLICY_KIND, "ns", "sgl")["metadata"]["uid"]
    assert canary.asked == [("sgl-decode-0", f"http://127.0.2.1:{WORKER_PORT}", uid)]
    assert ledger(kube) == [("CordonDecode", "sgl-decode-0", "Succeeded", False)]
    assert label(kube, "sgl-decode-0") == "false"
    entry = status(kube)["remediation"]["history"][0]
    assert "canary: no token within 30s" in entry["reason"]
