"""Whole remediation cycles in-process: the real shell (handlers + Remediator) over fakes.

No cluster, no sockets: `KubeFake` and `WorkerFake` (shell_fakes.py) stand in for the API server
and the worker pods, failures are injected per verb or per pod, and each test asserts what a user
would see afterwards: the ledger in status, pod conditions, rooms failed, Events, error counters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY
from shell_fakes import KubeFake, WorkerFake, cluster, pod

from pdwarden.constants import ANNOTATION_RESET_BREAKER, CONDITION_SERVING, KIND
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.k8s import ApiError
from pdwarden.remediation.scrape.worker_client import TOO_LARGE
from pdwarden.values import RoomView, ScrapeResult, Target

KEY = b"k" * 32


@pytest.fixture
def kube() -> KubeFake:
    return KubeFake()


@pytest.fixture
def workers() -> WorkerFake:
    return WorkerFake()


def state_for(kube: KubeFake, workers: WorkerFake) -> OperatorState:
    return OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)


def cycle(state: OperatorState, kube: KubeFake) -> float:
    """One cycle with the object as the API server holds it now (kopf's live body)."""
    return asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def history(kube: KubeFake) -> list[dict[str, Any]]:
    status = kube.obj(KIND, "ns", "pd").get("status") or {}
    return list((status.get("remediation") or {}).get("history") or [])


def done(kube: KubeFake) -> list[tuple[str, str, str]]:
    return [(e["action"], e["pod"], e.get("outcome", "Succeeded")) for e in history(kube)]


def errors(stage: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_operator_errors_total", {"stage": stage}) or 0.0


@pytest.fixture
def counted() -> Iterator[dict[str, float]]:
    """Error counts at the start of the test; read the increase with `errors(stage) - start`."""
    yield {s: errors(s) for s in ("scrape", "action", "event", "cycle", "status_write", "intent")}


def serving(kube: KubeFake, name: str) -> str:
    conditions = kube.obj("Pod", "ns", name)["status"]["conditions"]
    return next(c["status"] for c in conditions if c["type"] == CONDITION_SERVING)


def test_a_cycle_fails_wedged_rooms_with_the_token_and_records_it(
    kube: KubeFake, workers: WorkerFake
) -> None:
    cluster(kube)
    workers.stuck("pd-prefill-0", "pd-decode-1", 11, 12)
    state = state_for(kube, workers)
    assert cycle(state, kube) == 1.0
    assert workers.failed == {"pd-prefill-0": [11, 12]}
    [entry] = history(kube)
    assert (entry["action"], entry["pod"], entry["peer"], entry["rooms"]) == (
        "FailRooms", "pd-prefill-0", "pd-decode-1", 2,
    )  # fmt: skip
    assert all(t for t in workers.tokens["pd-prefill-0"])  # scraped and failed with a token
    assert workers.tokens["pd-decode-0"] == [None]  # decode pods never get it
    assert {e["reason"] for e in kube.events} >= {"WedgeDetected", "FailRooms"}


def test_an_action_taken_before_a_failed_status_write_is_not_lost(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float]
) -> None:
    cluster(kube, maxActionsPerHour=5)
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    state = state_for(kube, workers)
    # The first status write is the action's intent; the second, the cycle's own, fails.
    kube.fail["patch_status"] += [None, ApiError(503, "etcd leader changed")]
    cycle(state, kube)  # acts, then cannot write: contained, counted
    assert workers.failed == {"pd-prefill-0": [11]}
    assert done(kube) == [("FailRooms", "pd-prefill-0", "Pending")]  # the intent, on the server
    assert errors("status_write") - counted["status_write"] == 1
    assert errors("cycle") - counted["cycle"] == 1
    cycle(state, kube)  # nothing new to do: but the earlier action is completed now
    assert done(kube) == [("FailRooms", "pd-prefill-0", "Succeeded")]
    rem = kube.obj(KIND, "ns", "pd")["status"]["remediation"]
    assert rem["actionsLastHour"] == 1  # the breaker counted it, once
    cycle(state, kube)
    assert len(history(kube)) == 1  # carried once, never twice


def test_no_action_without_its_intent_on_the_api_server(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float]
) -> None:
    """Intent before action: when the Pending entry cannot be written, nothing is touched."""
    cluster(kube, maxActionsPerHour=5)
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    state = state_for(kube, workers)
    kube.fail["patch_status"].append(ApiError(503, "etcd leader changed"))
    cycle(state, kube)
    assert workers.failed == {}
    assert errors("intent") - counted["intent"] == 1
    cycle(state, kube)  # the API server is back: decided again, recorded, then done
    assert workers.failed == {"pd-prefill-0": [11]}
    assert done(kube) == [("FailRooms", "pd-prefill-0", "Succeeded")]


def test_the_intent_costs_one_status_write_per_action_not_per_cycle(
    kube: KubeFake, workers: WorkerFake
) -> None:
    """The durable ledger's price (issue 28): a cycle that acts writes the status once per
    action (its Pending intent) plus once for the cycle; a cycle with nothing to do adds none."""
    cluster(kube, maxActionsPerHour=5)
    state = state_for(kube, workers)
    cycle(state, kube)  # the first cycle writes the first status
    quiet = kube.calls["patch_status"]
    cycle(state, kube)
    assert kube.calls["patch_status"] == quiet  # nothing changed: nothing written
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    cycle(state, kube)
    assert done(kube) == [("FailRooms", "pd-prefill-0", "Succeeded")]
    assert kube.calls["patch_status"] - quiet == 2  # the intent, then the cycle's record


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ServerDisconnectedError(),
        RecursionError("maximum recursion depth exceeded while decoding a JSON array"),
        TimeoutError(),
        ValueError("garbage"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_exception_in_one_action_does_not_kill_the_cycle(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float], exc: BaseException
) -> None:
    cluster(kube)
    workers.stuck("pd-prefill-0", "pd-decode-0", 1)
    workers.stuck("pd-prefill-1", "pd-decode-1", 2)
    workers.fail_raises["pd-prefill-0"] = exc
    state = state_for(kube, workers)
    cycle(state, kube)
    assert sorted(done(kube)) == [
        ("FailRooms", "pd-prefill-0", "Failed"), ("FailRooms", "pd-prefill-1", "Succeeded"),
    ]  # fmt: skip
    assert workers.failed == {"pd-prefill-1": [2]}
    assert errors("action") - counted["action"] == 1
    assert errors("cycle") - counted["cycle"] == 0
    warning = [e for e in kube.events if e["reason"] == "FailRooms" and e["type"] == "Warning"]
    assert warning and "pd-prefill-0" in warning[0]["message"]


@pytest.mark.parametrize(
    "exc",
    [RecursionError(), aiohttp.ServerDisconnectedError(), ValueError("x" * 100_000), OSError()],
    ids=lambda e: type(e).__name__,
)
def test_a_failing_pod_does_not_stop_the_others(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float], exc: BaseException
) -> None:
    cluster(kube)
    workers.stuck("pd-prefill-0", "pd-decode-0", 1)
    workers.stuck("pd-prefill-1", "pd-decode-1", 2)
    workers.raises["pd-prefill-0"] = exc
    state = state_for(kube, workers)
    cycle(state, kube)
    assert done(kube) == [("FailRooms", "pd-prefill-1", "Succeeded")]
    assert workers.failed == {"pd-prefill-1": [2]}
    assert errors("scrape") - counted["scrape"] == 1
    assert errors("cycle") - counted["cycle"] == 0


def _repeat_offender(kube: KubeFake) -> None:
    """pd-decode-1's rooms were failed 5 s ago; they wedge again, so it is to be cordoned."""
    then = (datetime.now(UTC) - timedelta(seconds=5)).replace(microsecond=0)
    kube.objects[(KIND, "ns", "pd")]["status"] = {
        "remediation": {
            "history": [
                {"time": then.isoformat().replace("+00:00", "Z"), "action": "FailRooms",
                 "pod": "pd-prefill-0", "peer": "pd-decode-1", "rooms": 1, "reason": "earlier"}
            ]
        }
    }  # fmt: skip


@pytest.mark.parametrize("stale", [False, True])
def test_a_stale_pod_is_not_judged(kube: KubeFake, workers: WorkerFake, stale: bool) -> None:
    cluster(kube)
    _repeat_offender(kube)
    workers.stuck("pd-prefill-0", "pd-decode-1", 7)
    if stale:
        workers.raises["pd-decode-1"] = TimeoutError()
    state = state_for(kube, workers)
    cycle(state, kube)
    actions = [(a, p) for a, p, _ in done(kube)[1:]]
    if stale:  # its own metrics cannot be read: it is neither cordoned nor called healthy
        assert actions == [("FailRooms", "pd-prefill-0")]
        assert serving(kube, "pd-decode-1") == "True"
    else:
        assert actions == [("FailRooms", "pd-prefill-0"), ("CordonDecode", "pd-decode-1")]
        assert serving(kube, "pd-decode-1") == "False"


def test_hostile_worker_answers_reach_the_status_clean(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float]
) -> None:
    cluster(kube)
    workers.rooms["pd-prefill-0"] = [
        RoomView(5, "inflight", 30.0, "x" * 254, "inc"),  # no pod can have this name
        RoomView(6, "inflight", -5.0, "pd-decode-0", "inc-pd-decode-0"),  # negative age
        RoomView(7, "inflight\x00\x1b[31m", 1e300, "pd-decode-0", "inc-pd-decode-0"),
    ]
    state = state_for(kube, workers)
    cycle(state, kube)
    assert errors("cycle") - counted["cycle"] == 0
    status = kube.obj(KIND, "ns", "pd")["status"]
    wedges = status["wedges"]
    assert all(w.get("peer") in (None, "pd-decode-0") for w in wedges)
    assert all(0 <= w["oldestSeconds"] < 1e10 for w in wedges)
    assert workers.failed["pd-prefill-0"] == [5]  # room 5 (inflight 30 s) failed, no peer named
    [entry] = history(kube)
    assert "peer" not in entry


def test_api_server_down_is_contained_and_counted(
    kube: KubeFake, workers: WorkerFake, counted: dict[str, float]
) -> None:
    cluster(kube)
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    state = state_for(kube, workers)
    body = kube.obj(KIND, "ns", "pd")
    kube.down = ApiError(0, "GET /api/v1/pods: MaxRetryError: connection refused")
    for _ in range(3):
        assert asyncio.run(remediation_cycle(state, body)) == 1.0  # the loop keeps its period
    assert errors("cycle") - counted["cycle"] == 3
    assert state.cycles[body["metadata"]["uid"]] == 3
    assert workers.failed == {}  # nothing is done on pods it could not list
    kube.down = None
    cycle(state, kube)
    assert done(kube) == [("FailRooms", "pd-prefill-0", "Succeeded")]


def test_lookalike_pods_get_no_token_and_no_action(kube: KubeFake, workers: WorkerFake) -> None:
    pdd = cluster(kube)
    sts = kube.obj("StatefulSet", "ns", "pd-prefill")
    pod(kube, None, "pd-prefill-evil", "prefill", "127.0.9.1")  # our labels, no owner
    pod(kube, sts, "pd-prefill-7", "prefill", "127.0.9.2")  # claims our StatefulSet, no ordinal
    other = dict(sts, metadata={**sts["metadata"], "uid": "someone-else"})
    pod(kube, other, "pd-prefill-1x", "prefill", "127.0.9.3")
    for name in ("pd-prefill-evil", "pd-prefill-7", "pd-prefill-1x"):
        workers.stuck(name, "pd-decode-0", 99)
    state = state_for(kube, workers)
    cycle(state, kube)
    assert set(workers.tokens) == {"pd-prefill-0", "pd-prefill-1", "pd-decode-0", "pd-decode-1"}
    assert workers.failed == {} and history(kube) == []
    assert pdd["metadata"]["uid"]


def test_nothing_happens_over_more_cycles_when_nothing_is_wedged(
    kube: KubeFake, workers: WorkerFake
) -> None:
    cluster(kube)
    state = state_for(kube, workers)
    uid = kube.obj(KIND, "ns", "pd")["metadata"]["uid"]
    cycle(state, kube)
    rv = kube.obj(KIND, "ns", "pd")["metadata"]["resourceVersion"]
    for _ in range(5):
        cycle(state, kube)
    assert state.cycles[uid] == 6
    assert REGISTRY.get_sample_value(
        "pdwarden_remediation_cycles_total", {"namespace": "ns", "name": "pd"}
    )
    assert kube.obj(KIND, "ns", "pd")["metadata"]["resourceVersion"] == rv  # no status churn
    assert history(kube) == []


def test_the_breaker_reset_annotation_is_removed_once_the_reset_is_written(
    kube: KubeFake, workers: WorkerFake
) -> None:
    cluster(kube)
    kube.objects[(KIND, "ns", "pd")]["metadata"]["annotations"] = {ANNOTATION_RESET_BREAKER: "now"}
    state = state_for(kube, workers)
    kube.fail["patch_status"].append(ApiError(503, "unavailable"))
    cycle(state, kube)  # the write failed: the annotation must stay, or the reset is lost
    assert ANNOTATION_RESET_BREAKER in kube.obj(KIND, "ns", "pd")["metadata"]["annotations"]
    cycle(state, kube)
    obj = kube.obj(KIND, "ns", "pd")
    assert ANNOTATION_RESET_BREAKER not in (obj["metadata"].get("annotations") or {})
    assert obj["status"]["remediation"]["breakerResetAt"]


def test_a_pod_whose_metrics_are_over_the_cap_is_announced_once_and_counted(
    kube: KubeFake,
) -> None:
    """A refused body (over --max-metrics-bytes): the pod is not judged, a MetricsTooLarge
    Warning says so once, and pdwarden_scrape_refused_total (the chart's alert) moves."""

    @dataclass
    class TooLarge(WorkerFake):
        async def scrape(
            self, targets: Sequence[Target], token: str | None, tenant: str = ""
        ) -> list[ScrapeResult]:
            out = await super().scrape(targets, token, tenant)
            return [
                ScrapeResult(r.target, error="body over 4194304 bytes", refused=TOO_LARGE)
                if r.target.pod == "pd-decode-1" else r
                for r in out
            ]  # fmt: skip

    cluster(kube)
    state = state_for(kube, TooLarge())
    before = REGISTRY.get_sample_value("pdwarden_scrape_refused_total") or 0.0
    cycle(state, kube)
    cycle(state, kube)
    assert (REGISTRY.get_sample_value("pdwarden_scrape_refused_total") or 0.0) == before + 1
    [event] = [e for e in kube.events if e["reason"] == "MetricsTooLarge"]
    assert "pd-decode-1 is not judged" in event["message"]


def lose_node(kube: KubeFake, name: str) -> None:
    """What the node lifecycle controller does to a pod of a node that stopped reporting: its
    Ready condition False, nothing else (its containers still ready)."""
    conds = kube.objects[("Pod", "ns", name)]["status"]["conditions"]
    conds.append({"type": "ContainersReady", "status": "True"})
    next(c for c in conds if c["type"] == "Ready")["status"] = "False"


def test_pods_on_a_lost_node_are_unknown_and_never_acted_on(
    kube: KubeFake, workers: WorkerFake
) -> None:
    """The decode that would be cordoned (as in the test above) and the prefill whose rooms
    would be failed sit on a lost node: neither is asked, judged or touched, the Wedged
    condition says why, and no scrape error is counted. The healthy prefill's rooms that wait on
    the lost decode are still failed: that repair happens on a healthy node."""
    cluster(kube)
    _repeat_offender(kube)
    workers.stuck("pd-prefill-0", "pd-decode-1", 7)
    workers.stuck("pd-prefill-1", "pd-decode-0", 8)
    lose_node(kube, "pd-decode-1")
    lose_node(kube, "pd-prefill-1")
    errors_before = REGISTRY.get_sample_value("pdwarden_scrape_errors_total") or 0.0
    cycle(state_for(kube, workers), kube)
    assert [(a, p) for a, p, _ in done(kube)[1:]] == [("FailRooms", "pd-prefill-0")]
    assert serving(kube, "pd-decode-1") == "True"
    assert not {"pd-decode-1", "pd-prefill-1"} & set(workers.scraped)
    assert (REGISTRY.get_sample_value("pdwarden_scrape_errors_total") or 0.0) == errors_before
    conditions = kube.obj(KIND, "ns", "pd")["status"]["conditions"]
    wedged = next(c for c in conditions if c["type"] == "Wedged")
    assert "pd-decode-1: " in wedged["message"] and "stopped reporting" in wedged["message"]
