"""Prometheus mode in whole PDDeployment cycles: the real shell over fakes (issue 34).

`ScreenFake` stands in for Prometheus's screen (ports.ScreenApi): by default it holds what each
pod's /metrics says (the workers fake's own samples), and a test makes it lag, lose pods, fail,
or hold a stale view of one pod. Each test asserts what a user sees: which pods the operator read
directly, the ledger, Events, and the `Screened` condition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from shell_fakes import KubeFake, WorkerFake, cluster

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.values import Sample, Screened, ScreenView, Target

KEY = b"k" * 32
SOURCE = "http://prometheus.test:9090"
STEP = 2.0


@dataclass
class ScreenFake:
    """ports.ScreenApi: each pod as `workers` serves it, unless `error` (no usable answer),
    `missing[pod]` (the screen cannot tell), `direct[pod]` (read it directly) or `lie[pod]` (what
    the screen holds instead of the pod's own answer)."""

    workers: WorkerFake
    error: str = ""
    missing: dict[str, str] = field(default_factory=dict)
    direct: dict[str, str] = field(default_factory=dict)
    lie: dict[str, Sample] = field(default_factory=dict)
    looks: int = 0

    async def look(self, namespace: str, targets: Sequence[Target], max_age: float) -> ScreenView:
        self.looks += 1
        if self.error:
            return ScreenView(error=self.error, source=SOURCE)
        pods = {}
        for t in targets:
            if t.pod in self.missing:
                pods[t.uid] = Screened(missing=self.missing[t.pod])
            elif t.pod in self.direct:
                pods[t.uid] = Screened(direct=self.direct[t.pod])
            elif t.pod in self.lie:
                pods[t.uid] = Screened(self.lie[t.pod])
            else:  # Prometheus scraped it a second before the operator asked
                sample = self.workers._sample(t)
                pods[t.uid] = Screened(replace(sample, at=sample.at - 1.0))
        return ScreenView(pods, source=SOURCE)

    async def close(self) -> None:
        return None


@dataclass
class ClockWorkers(WorkerFake):
    """SGLang pods on a cycle clock (`tick`, 2 s a cycle): `stuck` prefills hold 3 rooms in
    their inflight queue and move nothing; every other pod moves its counters."""

    stuck_pods: set[str] = field(default_factory=set)
    tick: int = 0
    t0: float = field(default_factory=time.monotonic)

    def _sample(self, target: Target) -> Sample:
        n = self.tick
        if target.pod in self.stuck_pods:
            return Sample(
                at=self.t0 + STEP * n, inflight_queue=3.0, bootstrap_queue=0.0, kv_transfers=5.0,
                completed=5.0, failed=0.0, prefill_tokens=100.0,
            )  # fmt: skip
        moving = 7.0 * n
        return Sample(
            at=self.t0 + STEP * n, inflight_queue=0.0, bootstrap_queue=0.0, prealloc_queue=0.0,
            transfer_queue=0.0, running=0.0, waiting_queue=0.0, kv_transfers=moving,
            completed=moving, failed=0.0, prefill_tokens=moving, generated_tokens=moving,
        )  # fmt: skip


def state_for(kube: KubeFake, workers: WorkerFake, screen: ScreenFake) -> OperatorState:
    return OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY, screen=screen)


def cycles(state: OperatorState, kube: KubeFake, n: int = 1) -> None:
    for _ in range(n):
        if isinstance(state.workers, ClockWorkers):
            state.workers.tick += 1
        asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def screened(kube: KubeFake) -> dict[str, Any]:
    conditions = kube.obj(KIND, "ns", "pd")["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "Screened")


def history(kube: KubeFake) -> list[dict[str, Any]]:
    status = kube.obj(KIND, "ns", "pd").get("status") or {}
    return list((status.get("remediation") or {}).get("history") or [])


def reasons(kube: KubeFake) -> set[str]:
    return {e["reason"] for e in kube.events}


@pytest.fixture
def kube() -> KubeFake:
    return KubeFake()


def test_a_quiet_deployment_is_judged_from_the_screen_alone(kube: KubeFake) -> None:
    cluster(kube)
    workers = WorkerFake()
    screen = ScreenFake(workers)
    cycles(state_for(kube, workers, screen), kube, 3)
    assert workers.scraped == []  # not one direct scrape
    c = screened(kube)
    assert (c["status"], c["reason"]) == ("True", "Screened")
    assert "4 worker pod(s) screened by Prometheus (http://prometheus.test:9090)" in c["message"]


def test_stuck_rooms_are_read_directly_and_failed_while_decodes_stay_screened(
    kube: KubeFake,
) -> None:
    cluster(kube)
    workers = WorkerFake()
    workers.stuck("pd-prefill-0", "pd-decode-1", 11, 12)
    cycles(state_for(kube, workers, ScreenFake(workers)), kube)
    # The screen shows rooms held: pdworker prefills are read directly for their rooms list,
    # and the decode their rooms name; the other decode stays screened.
    assert set(workers.scraped) == {"pd-prefill-0", "pd-prefill-1", "pd-decode-1"}
    assert workers.failed == {"pd-prefill-0": [11, 12]}
    [entry] = history(kube)
    assert (entry["action"], entry["pod"], entry["outcome"]) == ("FailRooms", "pd-prefill-0",
                                                                 "Succeeded")  # fmt: skip


def sglang(kube: KubeFake) -> None:
    cluster(kube, prefill=2, decode=1, mode="DryRun", wedgeAfterSeconds=4)
    spec = kube.objects[(KIND, "ns", "pd")]["spec"]
    spec["engine"] = "sglang"
    for role in ("prefill", "decode"):
        spec[role] |= {"gpus": 1}


def test_a_wedge_found_on_the_screen_is_decided_on_a_direct_read(kube: KubeFake) -> None:
    sglang(kube)
    workers = ClockWorkers(stuck_pods={"pd-prefill-0"})
    state = state_for(kube, workers, ScreenFake(workers))
    cycles(state, kube, 5)
    decided = [(e["action"], e["pod"]) for e in history(kube)]
    assert decided and set(decided) == {("AbortRequests", "pd-prefill-0")}
    assert "pd-prefill-0" in workers.scraped  # the finding's pod, read directly
    assert "pd-prefill-1" not in workers.scraped  # the healthy prefill: screened throughout
    assert "WedgeDetected" in reasons(kube)


def test_a_wedge_only_the_screen_shows_is_never_acted_on(kube: KubeFake) -> None:
    """Prometheus holds a stale view of a pod whose own /metrics moves: the direct read that
    the finding calls for disagrees, and nothing is decided, announced or recorded."""
    sglang(kube)
    workers = ClockWorkers()
    screen = ScreenFake(workers)
    state = state_for(kube, workers, screen)
    t0 = workers.t0
    for n in range(1, 7):
        screen.lie["pd-prefill-0"] = Sample(
            at=t0 + STEP * n - 1.0, inflight_queue=3.0, bootstrap_queue=0.0, kv_transfers=5.0,
            completed=5.0, failed=0.0, prefill_tokens=100.0,
        )  # fmt: skip
        cycles(state, kube)
    assert "pd-prefill-0" in workers.scraped  # the screen's finding was checked
    assert history(kube) == [] and "WedgeDetected" not in reasons(kube)


def test_prometheus_down_leaves_every_pod_unjudged_and_untouched(kube: KubeFake) -> None:
    cluster(kube)
    workers = WorkerFake()
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    screen = ScreenFake(workers, error="no answer within 5s")
    cycles(state_for(kube, workers, screen), kube, 3)
    assert workers.scraped == [] and workers.failed == {} and history(kube) == []
    c = screened(kube)
    assert (c["status"], c["reason"]) == ("False", "PrometheusUnavailable")
    assert "no answer within 5s" in c["message"] and "none of the 4 worker pod(s)" in c["message"]


def test_pods_the_screen_cannot_tell_about_are_named_and_not_acted_on(kube: KubeFake) -> None:
    cluster(kube)
    workers = WorkerFake()
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    screen = ScreenFake(workers, missing={"pd-prefill-0": "Prometheus holds no series of it"})
    cycles(state_for(kube, workers, screen), kube, 2)
    assert "pd-prefill-0" not in workers.scraped and workers.failed == {}
    c = screened(kube)
    assert (c["status"], c["reason"]) == ("False", "PrometheusPartial")
    assert "1 of 4 worker pod(s) not judged" in c["message"]
    assert "pd-prefill-0: Prometheus holds no series of it" in c["message"]
    screen.missing = {p: "Prometheus last scraped it 40s ago (at most 2s)" for p in
                      ("pd-prefill-0", "pd-decode-0")}  # fmt: skip
    cycles(state_for(kube, workers, screen), kube)
    assert screened(kube)["reason"] == "PrometheusLagging"


def test_a_pod_prometheus_cannot_scrape_is_read_directly(kube: KubeFake) -> None:
    cluster(kube)
    workers = WorkerFake()
    screen = ScreenFake(workers, direct={"pd-decode-1": "Prometheus could not scrape it"})
    cycles(state_for(kube, workers, screen), kube, 2)
    assert workers.scraped == ["pd-decode-1", "pd-decode-1"]
    assert "1 read directly this cycle" in screened(kube)["message"]
