"""pdwarden watching `engine: sglang` pods on the local cluster. THE ENGINE IS SIMULATED.

No GPU here, so no real SGLang: the local kubelet runs e2e/sglang_sim.py for the SGLang image,
a stand-in that follows SGLang 0.5.23's source (observability/metrics_collector.py for the
/metrics series and labels, entrypoints/http_server.py for /ready, /health and /abort_request,
managers/scheduler.py for what abort_all drops) and plays phases set per pod by these tests.
What is real: the API server, the rendered SGLang pods (command line, probes, volumes), the
operator process, its scrapes, detection, policy, the abort call and the pod deletes.

Three scenarios, as issue 12 asks: a healthy long decode (four long requests: throughput but no
finishes, so SGLang's finish-time counters stay flat) and a saturated healthy prefill draw no
action; a prefill whose inflight rooms stop draining while decode is idle gets its requests
aborted (and, if that does not drain it, a restart); a decode with a transfer queue and zero
throughput is cordoned and restarted.

Every pod is probed like a real one (issue 25): the kubelet runs the rendered /health liveness
probe, and `probed` adds what sgl-router's worker health checks do, a GET /health on every pod
each second, so every detection window holds probes. The simulator's /health runs through its
scheduler against a fake KV peer and moves what SGLang 0.5.23 moves for it (e2e/sglang_sim.py).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess
from e2e.pdtools import apply, get_json, ledger, pods, status, wait_ready

from pdwarden.constants import API_VERSION, KIND, WORKER_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 1, 4, 5
PROBE_EVERY = 1.0
ALL_ACTIONS = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]
READY = {"prefill": "1/1", "decode": "2/2"}


def sglang_deployment(prefill_phase: str, decode_phase: str) -> dict[str, Any]:
    """Pods (and their replacements) start in the given simulator phases."""

    def phase(p: str) -> list[dict[str, str]]:
        return [{"name": "SGLANG_SIM_PHASE", "value": p}]

    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "pd"},
        "spec": {
            "engine": "sglang",
            "image": "pdwarden/sglang-sim:v0.5.23",  # the simulator on the local kubelet
            "model": {"name": "simulated/tiny"},
            "prefill": {"replicas": 1, "gpus": 1, "env": phase(prefill_phase),
                        "args": ["--enable-priority-scheduling"]},
            "decode": {"replicas": 2, "gpus": 1, "env": phase(decode_phase),
                       "args": ["--enable-priority-scheduling", "--dp-size", "2"]},
            "router": {"replicas": 0},
            "sglang": {"startupTimeoutSeconds": 120},
            "remediation": {
                "scrapeIntervalSeconds": SCRAPE, "wedgeAfterSeconds": WEDGE_AFTER,
                "restartAfterSeconds": RESTART_AFTER, "cooldownSeconds": 2,
                "maxUnavailableDecode": 1, "actions": ALL_ACTIONS,
                # The pair canary (both sides' /health) is tested on the real SGLang pair
                # (test_sglang_real.py); here its own /metrics reads and probes would blur the
                # reads and probes these scenarios count.
                "canary": {"enabled": False},
            },
        },
    }  # fmt: skip


def url(pod: dict[str, Any], path: str) -> str:
    return f"http://{pod['status']['podIP']}:{WORKER_PORT}{path}"


def sim(pod: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
    """The simulator's own account of a pod (POST sets its phase first)."""
    if phase is None:
        req = urllib.request.Request(url(pod, "/sim/state"))
    else:
        body = json.dumps({"phase": phase}).encode()
        req = urllib.request.Request(url(pod, "/sim/phase"), body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def events(cluster: Cluster, ns: str, reason: str) -> list[dict[str, Any]]:
    items = get_json(cluster, ns, "events", "--field-selector", f"reason={reason}")["items"]
    return list(items)


def start(
    cluster: Cluster, ns: str, prefill_phase: str = "healthy", decode_phase: str = "healthy"
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    apply(cluster, ns, sglang_deployment(prefill_phase, decode_phase))
    wait_ready(cluster, ns, READY, timeout=240)
    prefill = pods(cluster, ns, "prefill")[0]
    decodes = pods(cluster, ns, "decode")
    assert sim(prefill)["simulated"] is True
    return prefill, decodes


@pytest.fixture
def probed(cluster: Cluster, namespace: str) -> Iterator[dict[str, int]]:
    """GET /health on every worker pod of the namespace every PROBE_EVERY seconds, as a router's
    health checks do; pods are listed again every few rounds (they get replaced)."""
    stop, answered = threading.Event(), {"ok": 0, "failed": 0}

    def run() -> None:
        targets: list[dict[str, Any]] = []
        for round_ in range(10**9):
            if round_ % 5 == 0:
                try:
                    targets = [p for role in ("prefill", "decode")
                               for p in pods(cluster, namespace, role)
                               if (p.get("status") or {}).get("podIP")]  # fmt: skip
                except Exception:  # the namespace is still being set up or torn down
                    targets = []
            for p in targets:
                try:
                    with urllib.request.urlopen(url(p, "/health"), timeout=2) as resp:
                        answered["ok" if resp.status == 200 else "failed"] += 1
                except OSError:
                    answered["failed"] += 1
            if stop.wait(PROBE_EVERY):
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield answered
    stop.set()
    thread.join(10)


def watch_cycles(cluster: Cluster, op: OperatorProcess, cycles: int) -> None:
    """Wait until the operator has scraped every pod `cycles` more times."""
    target = op.metric("pdwarden_scrapes_total") + 3 * cycles
    cluster.wait_until(
        f"{cycles} more scrape cycles",
        lambda: op.metric("pdwarden_scrapes_total") >= target,
        timeout=cycles * SCRAPE * 10 + 60,
    )


def test_sglang_pods_render_and_start_with_cheap_probes(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    prefill, _ = start(cluster, namespace)
    c = prefill["spec"]["containers"][0]
    assert c["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/cache", "/dev/shm", "/tmp"}


def test_healthy_long_decode_and_saturated_prefill_draw_no_action(
    cluster: Cluster, namespace: str, operator: OperatorProcess, probed: dict[str, int]
) -> None:
    ns = namespace
    prefill, decodes = start(cluster, ns, prefill_phase="idle", decode_phase="healthy")
    # Saturated prefill: its inflight queue drains but never empties. Long decodes: four long
    # requests each, gen_throughput > 0, no request finishes for the whole watch.
    sim(prefill, "healthy")
    for d in decodes:
        sim(d, "long")
    watch_cycles(cluster, operator, cycles=6 * WEDGE_AFTER)
    assert ledger(cluster, ns) == []
    assert sim(prefill)["aborts"] == []
    assert probed["ok"] >= 6 * WEDGE_AFTER  # probed all along
    st = status(cluster, ns)
    wedged = next(c for c in st["conditions"] if c["type"] == "Wedged")
    assert wedged["status"] == "False", wedged["message"]


def test_wedged_prefill_gets_its_requests_aborted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, probed: dict[str, int]
) -> None:
    ns = namespace
    prefill, _ = start(cluster, ns, prefill_phase="idle", decode_phase="idle")
    assert sim(prefill, "wedged")["held"]["inflight"] == 3

    def aborted() -> list[dict[str, Any]]:
        return [e for e in ledger(cluster, ns) if e["action"] == "AbortRequests"]

    entry = cluster.wait_until("AbortRequests in the ledger", aborted, timeout=60)[0]
    assert entry["pod"] == prefill["metadata"]["name"] and entry["outcome"] == "Succeeded"
    # The ledger says what was done and what it cost: every held request, read just before,
    # and how many of them were healthy (none for sure: only the wedged rooms were held). The
    # gauges may still count a /health probe per DP rank that already left (its batch was the
    # last report of a wedged rank: act/abort_cost.py), so the count is 3 to 3 + 2.
    assert 3 <= entry["rooms"] <= 3 + 2, entry
    assert "abort_all=true" in entry["reason"]
    cost = re.search(r"aborted (\d+) requests: (\d+) wedged, 0(-\d+)? healthy", entry["reason"])
    assert cost is not None and int(cost[1]) == entry["rooms"] and int(cost[2]) >= 3, entry
    state = sim(prefill)
    assert [a["held"] for a in state["aborts"]] == [3]
    assert state["held"]["inflight"] == 0
    # Probed all along (each probe moved the series that used to read as drain), and repaired
    # within wedgeAfterSeconds + two scrapes: a window of WEDGE_AFTER seconds spans
    # WEDGE_AFTER / SCRAPE + 1 reads of this pod's /metrics after the wedge, plus one when the
    # first of them was stamped late (a sample's time is when its body arrived, and a loaded
    # machine delays one read more than the next: CI saw it), plus the operator's own read of
    # the gauges just before the abort (act/sglang_abort.py).
    assert state["probes"]["ran"] >= WEDGE_AFTER / PROBE_EVERY - 1
    assert state["aborts"][0]["metrics_reads_since_phase"] <= WEDGE_AFTER // SCRAPE + 1 + 1 + 1
    told = cluster.wait_until(
        "AbortRequests Event", lambda: events(cluster, ns, "AbortRequests"), timeout=30
    )
    assert all(cost[0] in e["message"] for e in told), told
    # Drained: the ladder stops at the abort, the same pod keeps serving.
    watch_cycles(cluster, operator, cycles=2 * RESTART_AFTER)
    assert [e["action"] for e in ledger(cluster, ns)] == ["AbortRequests"]
    assert pods(cluster, ns, "prefill")[0]["metadata"]["uid"] == prefill["metadata"]["uid"]


def test_prefill_that_an_abort_does_not_drain_is_restarted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, probed: dict[str, int]
) -> None:
    ns = namespace
    prefill, _ = start(cluster, ns, prefill_phase="idle", decode_phase="idle")
    sim(prefill, "wedged-sticky")
    old_uid = prefill["metadata"]["uid"]

    def restarted() -> list[dict[str, Any]]:
        return [e for e in ledger(cluster, ns) if e["action"] == "RestartPrefill"]

    entry = cluster.wait_until("RestartPrefill in the ledger", restarted, timeout=90)[0]
    assert entry["outcome"] == "Succeeded", entry
    first = ledger(cluster, ns)[:2]
    assert [e["action"] for e in first] == ["AbortRequests", "RestartPrefill"]
    # 3 wedged rooms, plus at most one /health probe per DP rank the gauges still count.
    assert 3 <= first[0]["rooms"] <= 3 + 2 and "still wedged" in first[1]["reason"]
    cluster.wait_until(
        "a new prefill pod",
        lambda: any(p["metadata"]["uid"] != old_uid for p in pods(cluster, ns, "prefill")),
        timeout=90,
    )


def test_stalled_decode_is_cordoned_then_restarted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, probed: dict[str, int]
) -> None:
    ns = namespace
    _, decodes = start(cluster, ns, prefill_phase="idle", decode_phase="healthy")
    stalled, healthy = decodes
    sim(stalled, "stalled")  # requests wait in the transfer queue, throughput 0
    name, old_uid = stalled["metadata"]["name"], stalled["metadata"]["uid"]

    def acted(kind: str) -> Any:
        return lambda: [e for e in ledger(cluster, ns) if e["action"] == kind and e["pod"] == name]

    cluster.wait_until("CordonDecode of the stalled pod", acted("CordonDecode"), timeout=60)
    cluster.wait_until("RestartDecode of the stalled pod", acted("RestartDecode"), timeout=60)
    cluster.wait_until(
        "the stalled decode pod replaced",
        lambda: any(p["metadata"]["uid"] != old_uid for p in pods(cluster, ns, "decode")),
        timeout=90,
    )
    # The healthy decode pod was never touched; the stalled one was probed all along (its
    # transfer queue does not keep SGLang's probe from running).
    assert all(e["pod"] != healthy["metadata"]["name"] for e in ledger(cluster, ns))
    assert probed["ok"] > 0
