"""Remediation end to end: real pdworker pods wedge on purpose and the operator repairs them.

Every scenario runs on the local control plane with real worker processes moving real KV over
NIXL; faults are switched on through the workers' documented fault switches. The scenarios that
take `each_mode` run twice: the operator scraping every pod (direct), and the operator screening
them through a real Prometheus that discovers and scrapes them as the chart's PodMonitor says
(prometheus, `--observe prometheus`): both must find and repair the same way.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e import promtool
from e2e.cluster.controlplane import free_port
from e2e.fixtures import Cluster, OperatorProcess
from e2e.pdtools import (
    admin_token,
    apply,
    condition,
    cpu_example,
    generate,
    generate_when_routed,
    get_json,
    http,
    ledger,
    pod_condition,
    pods,
    router_url,
    scrape,
    status,
    wait_ready,
)
from e2e.prometheus import PrometheusServer, screen_server
from prometheus_client import REGISTRY

import pdwarden.metrics  # noqa: F401  (registers the operator's metrics in REGISTRY)
from pdwarden.constants import CONDITION_SERVING, KIND, WORKER_PORT
from pdworker import contract as pdw

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 1, 4, 5
FAST = {
    "scrapeIntervalSeconds": SCRAPE,
    "wedgeAfterSeconds": WEDGE_AFTER,
    "restartAfterSeconds": RESTART_AFTER,
    "cooldownSeconds": 2,
    "maxUnavailableDecode": 1,
}
SERVING = CONDITION_SERVING


@pytest.fixture(scope="module")
def screen(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """One real Prometheus for the module's prometheus-mode operators."""
    work = tmp_path_factory.mktemp("screen")
    server = screen_server(cluster.helm_path, Path(cluster.kubeconfig), work, free_port())
    yield server
    server.stop()


@pytest.fixture(params=["direct", "prometheus"])
def each_mode(
    request: pytest.FixtureRequest, cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """An operator watching only this test's namespace, in each observation mode; after the
    test, a prometheus-mode one must have judged pods from the screen."""
    extra: list[str] = []
    if request.param == "prometheus":
        server: PrometheusServer = request.getfixturevalue("screen")
        extra = ["--observe=prometheus", f"--prometheus-url={server.url}"]
    op = OperatorProcess(cluster, [namespace], tmp_path / "operator.log", *extra).start()
    yield op
    if request.param == "prometheus":
        screened = op.metric("pdwarden_screened_pods_total", how="screened")
        assert screened > 0, f"the operator never judged a pod from the screen; {op.log_path}"
        queries = op.metric("pdwarden_screen_queries_total", result="ok")
        print(f"[screen] {queries:.0f} queries, {screened:.0f} pods screened, "
              f"{op.metric('pdwarden_screened_pods_total', how='direct'):.0f} read directly",
              flush=True)  # fmt: skip
    op.stop()


def env(faults: str) -> list[dict[str, str]]:
    return [{"name": "PDWORKER_FAULTS", "value": faults}]


def actions(cluster: Cluster, ns: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in ledger(cluster, ns) if e["action"] == kind]


def events(cluster: Cluster, ns: str, reason: str) -> list[dict[str, Any]]:
    items = get_json(cluster, ns, "events", "--field-selector", f"reason={reason}")["items"]
    return list(items)


def load(url: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run `pdworker load` against the router and return its JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "summary.json"
        out = subprocess.run(
            [str(Path(sys.executable).parent / "pdworker"), "load", "--url", url,
             "--json", str(path), *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert path.exists(), out.stderr
        summary: dict[str, Any] = json.loads(path.read_text())
        return summary


def stall(cluster: Cluster, ns: str, pod: dict[str, Any]) -> None:
    ip = pod["status"]["podIP"]
    code, body = http(
        "POST", f"http://{ip}:{WORKER_PORT}/admin/decode-stall", {}, token=admin_token(cluster, ns)
    )
    assert code == 200, body


def held_by(pod: dict[str, Any]) -> float:
    """Requests `pod` (a decode) holds now: waiting for pages, for KV, or decoding."""
    m = scrape(f"http://{pod['status']['podIP']}:{WORKER_PORT}/metrics")
    queues = (pdw.DECODE_PREALLOC_QUEUE, pdw.DECODE_TRANSFER_QUEUE, pdw.DECODE_RUNNING)
    return sum(m.get(q, 0.0) for q in queues)


def load_until_held(
    cluster: Cluster, ns: str, victim: dict[str, Any], *args: str, rounds: int = 4
) -> dict[str, Any]:
    """Run `load` until the stalled `victim` holds requests, and return the last summary. The
    router finds decode pods by listing them every 2 s: right after the pods turn Ready
    it may know only the other one, and a quick load then never reaches the victim (seen in CI:
    no wedge, so no decision, and a timeout that said nothing about why)."""
    for _ in range(rounds):
        summary = load(router_url(cluster, ns), *args)
        if held_by(victim) > 0:
            return summary
    raise AssertionError(f"{rounds} loads and {victim['metadata']['name']} holds no request")


def remediation_of(cluster: Cluster, ns: str) -> dict[str, Any]:
    """What the operator thought, for a failure message: conditions and the ledger."""
    st = status(cluster, ns)
    return {"conditions": st.get("conditions"), "remediation": st.get("remediation")}


def decode_stall_deployment(**remediation: Any) -> dict[str, Any]:
    return cpu_example(
        decode={"replicas": 2, "env": env("decode-stall")},
        remediation={**FAST, **remediation},
    )


def test_abort_race_wedge_fails_exactly_the_wedged_rooms(
    cluster: Cluster, namespace: str, each_mode: OperatorProcess
) -> None:
    ns = namespace
    race = {"env": env("legacy-status-race,no-inflight-watchdog"),
            "args": ["--prefill-chunk-ms", "3", "--chunk-pages", "1"]}  # fmt: skip
    apply(cluster, ns, cpu_example(prefill=race, decode=race, remediation=FAST))
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    uids = {p["metadata"]["uid"] for p in pods(cluster, ns, "decode")}
    prefill = pods(cluster, ns, "prefill")[0]
    prefill_url = f"http://{prefill['status']['podIP']}:{WORKER_PORT}"
    token = admin_token(cluster, ns)

    stuck: list[dict[str, Any]] = []
    summaries = []
    for _ in range(4):  # storms until the race leaves rooms stuck in the inflight queue
        summaries.append(
            load(router_url(cluster, ns), "--clients", "30", "--requests", "600",
                 "--cancel-fraction", "0.3", "--cancel-max-ms", "150", "--prompt-len", "4:64",
                 "--output-len", "1:8")
        )  # fmt: skip
        code, rooms = http("GET", prefill_url + "/admin/rooms", token=token)
        assert code == 200
        stuck = [r for r in rooms if r["phase"] == "inflight"]
        if stuck:
            break
    assert stuck, "the legacy-status-race fault did not wedge any room"
    snapshot = time.monotonic()
    youngest = min(r["phase_seconds"] for r in stuck)
    budget = max(0.0, WEDGE_AFTER - youngest) + 2 * SCRAPE + 5  # +5: kubectl/scrape latency

    def drained() -> bool:
        m = scrape(prefill_url + "/metrics")
        return m.get(pdw.PREFILL_INFLIGHT_QUEUE) == 0

    cluster.wait_until("prefill inflight queue drained", drained, budget + 10)
    took = time.monotonic() - snapshot
    assert took <= budget, f"took {took:.1f}s, allowed {budget:.1f}s"
    failed = actions(cluster, ns, "FailRooms")
    assert failed and all(e["outcome"] == "Succeeded" for e in failed)
    # Every admin failure on the worker is one the operator recorded, and covers the snapshot.
    admin_failed = scrape(prefill_url + "/metrics").get(
        f'{pdw.REQUESTS_FAILED}{{reason="admin"}}', 0
    )
    assert admin_failed == sum(e["rooms"] for e in failed) >= len(stuck)
    # No healthy room was failed: no client request ever saw an admin failure.
    assert all(s["failed"].get("admin", 0) == 0 for s in summaries), summaries
    assert generate_when_routed(cluster, ns, "after the repair").get("ok") is True
    assert {p["metadata"]["uid"] for p in pods(cluster, ns, "decode")} == uids
    assert not actions(cluster, ns, "RestartDecode")


def test_stalled_decode_is_cordoned_restarted_and_uncordoned(
    cluster: Cluster, namespace: str, each_mode: OperatorProcess
) -> None:
    ns = namespace
    apply(cluster, ns, decode_stall_deployment())
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    victim, healthy = pods(cluster, ns, "decode")
    stall(cluster, ns, victim)
    # Work reaches the stalled pod (the router picks decode pods at random) and sticks there.
    summary = load_until_held(
        cluster, ns, victim, "--clients", "4", "--requests", "24", "--timeout", "8"
    )
    assert summary["completed"] > 0

    def cordoned() -> Any:
        pod = get_json(cluster, ns, "pod", victim["metadata"]["name"])
        cond = pod_condition(pod, SERVING)
        return cond.get("status") == "False" and pod["metadata"]["uid"] == victim["metadata"]["uid"]

    cluster.wait_until("the stalled pod to be cordoned", cordoned, WEDGE_AFTER + 15)
    # Cordoned: no new request reaches it, the other decode pod keeps serving.
    for i in range(6):
        answer = generate(cluster, ns, f"while cordoned {i}")
        assert answer.get("ok") is True, answer
        assert answer["decode"] == f"http://{healthy['status']['podIP']}:{WORKER_PORT}"

    def replaced() -> Any:
        pod = get_json(cluster, ns, "pod", victim["metadata"]["name"])
        return pod and pod["metadata"]["uid"] != victim["metadata"]["uid"] and pod

    cluster.wait_until("the stalled pod to be restarted", replaced, RESTART_AFTER + 30)
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, timeout=120)
    new = get_json(cluster, ns, "pod", victim["metadata"]["name"])
    assert pod_condition(new, SERVING)["status"] == "True"
    kinds = [e["action"] for e in ledger(cluster, ns)]
    assert kinds.count("CordonDecode") == 1 and kinds.count("RestartDecode") == 1
    assert healthy["metadata"]["uid"] in {p["metadata"]["uid"] for p in pods(cluster, ns, "decode")}
    # The new pod serves. The router picks a decode pod at random among those its discovery
    # listed (refreshed every 2 s), and fast workers answer a dozen requests before the new pod
    # is listed: send requests until one lands there, over several refreshes.
    new_url = f"http://{new['status']['podIP']}:{WORKER_PORT}"
    sent = itertools.count()

    def served_by_new_pod() -> bool:
        return bool(generate(cluster, ns, f"after {next(sent)}")["decode"] == new_url)

    cluster.wait_until("a request served by the restarted decode pod", served_by_new_pod, 20)
    assert events(cluster, ns, "CordonDecode") and events(cluster, ns, "RestartDecode")


def test_dry_run_decides_and_records_but_changes_nothing(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    ns = namespace
    apply(cluster, ns, decode_stall_deployment(mode="DryRun"))
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    victim, _ = pods(cluster, ns, "decode")
    stall(cluster, ns, victim)
    load_until_held(cluster, ns, victim, "--clients", "4", "--requests", "16", "--timeout", "6")
    cluster.wait_until(
        "a dry-run restart decision",
        lambda: any(e["dryRun"] for e in actions(cluster, ns, "RestartDecode")),
        WEDGE_AFTER + RESTART_AFTER + 20,
        explain=lambda: remediation_of(cluster, ns),
    )
    pod = get_json(cluster, ns, "pod", victim["metadata"]["name"])
    assert pod["metadata"]["uid"] == victim["metadata"]["uid"]  # not restarted
    assert pod_condition(pod, SERVING)["status"] == "True"  # not cordoned
    assert all(e["dryRun"] for e in ledger(cluster, ns))
    assert events(cluster, ns, "DryRunCordonDecode") and events(cluster, ns, "DryRunRestartDecode")
    assert condition(status(cluster, ns), "Wedged")["status"] == "True"


def test_long_prefill_is_not_a_wedge(
    cluster: Cluster, namespace: str, each_mode: OperatorProcess
) -> None:
    ns, operator = namespace, each_mode
    # 60 one-page chunks at 100 ms: a 6 s prefill, longer than wedgeAfterSeconds (4 s).
    slow = {"args": ["--prefill-chunk-ms", "100", "--chunk-pages", "1"]}
    # Two decode pods, so the last-serving-pod protection cannot hide a false cordon.
    apply(cluster, ns, cpu_example(prefill=slow, decode={"replicas": 2}, remediation=FAST))
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    started = time.monotonic()
    code, answer = http(
        "POST", router_url(cluster, ns) + "/generate",
        {"input_ids": list(range(1, 16 * 60)), "max_new_tokens": 2}, timeout=60,
    )  # fmt: skip
    assert code == 200 and answer.get("ok") is True, answer
    assert time.monotonic() - started > WEDGE_AFTER
    operator.wait_cycles(2)  # cycles that saw the finished request, not only the long one
    assert ledger(cluster, ns) == []
    assert condition(status(cluster, ns), "Wedged")["status"] == "False"


def test_budget_limits_cordons_and_the_breaker_trips(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    ns = namespace
    doc = cpu_example(
        decode={"replicas": 4, "env": env("decode-stall")},
        remediation={**FAST, "maxUnavailableDecode": "25%", "maxActionsPerHour": 3,
                     "restartAfterSeconds": 3, "cooldownSeconds": 1},
    )  # fmt: skip
    apply(cluster, ns, doc)
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "4/4", "router": "1/1"}, timeout=240)
    max_seen = 0
    for pod in pods(cluster, ns, "decode"):
        stall(cluster, ns, pod)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        load(router_url(cluster, ns), "--clients", "8", "--requests", "16", "--timeout", "3")
        out = [
            p
            for p in pods(cluster, ns, "decode")
            if pod_condition(p, SERVING).get("status") == "False"
        ]
        max_seen = max(max_seen, len(out))
        assert len(out) <= 1, "more decode pods cordoned than the 25% budget allows"
        if condition(status(cluster, ns), "RemediationSuspended").get("status") == "True":
            break
    st = status(cluster, ns)
    suspended = condition(st, "RemediationSuspended")
    assert suspended["status"] == "True", st.get("remediation")
    assert "maxActionsPerHour" in suspended["message"]
    assert st["remediation"]["suspended"] is True
    assert max_seen == 1
    taken = [e for e in ledger(cluster, ns) if e["action"] != "UncordonDecode"]
    assert len(taken) == 3
    # The chart's alert fires: Prometheus (promtool), evaluating the rules helm renders over
    # what this operator serves, held past the rule's `for:`, fires it for this deployment and
    # nothing else in this namespace.
    rules = promtool.render_rules(cluster.helm_path)
    mine = {"kind": KIND, "namespace": ns, "name": "pd"}
    out = promtool.Promtool.locate().firing_on(
        rules, operator.metrics_text(), "PDWardenRemediationSuspended", [mine], ns
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_unreachable_metrics_are_unknown_never_acted_on(
    cluster: Cluster, namespace: str, each_mode: OperatorProcess
) -> None:
    ns, operator = namespace, each_mode
    apply(cluster, ns, decode_stall_deployment())
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    victim, _ = pods(cluster, ns, "decode")
    # Freeze a decode process: its /metrics stops answering, so it is unknown, never wedged,
    # even while requests routed to it pile up.
    pid = worker_pid(victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        errors_before = operator.metric("pdwarden_scrape_errors_total")

        def explained() -> Any:
            cond = condition(status(cluster, ns), "Wedged")
            return cond.get("reason") == "MetricsUnavailable" and cond

        cond = cluster.wait_until("the Wedged condition to explain", explained, 30)
        assert victim["metadata"]["name"] in cond["message"] and cond["status"] == "Unknown"
        load(router_url(cluster, ns), "--clients", "4", "--requests", "8", "--timeout", "3")
        # Enough cycles, each at least SCRAPE apart, that a cordon and a restart would be due
        # had the frozen pod been judged wedged.
        operator.wait_cycles((WEDGE_AFTER + RESTART_AFTER) // SCRAPE + 1)
        assert operator.metric("pdwarden_scrape_errors_total") > errors_before
        pod = get_json(cluster, ns, "pod", victim["metadata"]["name"])
        assert pod["metadata"]["uid"] == victim["metadata"]["uid"]
        assert pod_condition(pod, SERVING)["status"] == "True"
        assert not [e for e in ledger(cluster, ns) if e["pod"] == victim["metadata"]["name"]]
    finally:
        os.kill(pid, signal.SIGCONT)


def test_operator_restart_mid_ladder_neither_repeats_nor_skips(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> None:
    ns = namespace
    first = OperatorProcess(cluster, [ns], tmp_path / "op1.log").start()
    apply(cluster, ns, decode_stall_deployment(restartAfterSeconds=12, cooldownSeconds=12))
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    victim, _ = pods(cluster, ns, "decode")
    stall(cluster, ns, victim)
    load_until_held(cluster, ns, victim, "--clients", "4", "--requests", "16", "--timeout", "4")
    cluster.wait_until("the cordon", lambda: actions(cluster, ns, "CordonDecode"), 30)
    first.kill(signal.SIGKILL)
    second = OperatorProcess(cluster, [ns], tmp_path / "op2.log").start()
    try:

        def replaced() -> Any:
            pod = get_json(cluster, ns, "pod", victim["metadata"]["name"])
            return pod and pod["metadata"]["uid"] != victim["metadata"]["uid"]

        cluster.wait_until("the restart by the second operator", replaced, 60)
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, timeout=120)
        second.wait_cycles(3)  # cycles of the second operator after the new pod is Ready
        kinds = [e["action"] for e in ledger(cluster, ns)]
        assert kinds.count("CordonDecode") == 1, kinds
        assert kinds.count("RestartDecode") == 1, kinds
        assert (
            len(events(cluster, ns, "CordonDecode")) == 2
        )  # one on the PDDeployment, one on the pod
    finally:
        second.stop()


def worker_pid(pod: dict[str, Any]) -> int:
    """The local kubelet runs each container as a process whose environment names the pod UID."""
    uid = pod["metadata"]["uid"]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"POD_UID={uid}".encode() in environ and b"decode" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no process found for pod {pod['metadata']['name']}")


def test_decode_killed_mid_transfer_frees_rooms_of_the_old_incarnation(
    cluster: Cluster, namespace: str, each_mode: OperatorProcess
) -> None:
    ns = namespace
    # Slow prefills keep rooms in flight; no inflight watchdog and a long peer timeout, so the
    # prefill does not clear rooms of a dead peer by timing out on its own.
    prefill_args = ["--prefill-chunk-ms", "40", "--chunk-pages", "1", "--peer-timeout", "300"]
    apply(cluster, ns, cpu_example(
        prefill={"args": prefill_args, "env": env("no-inflight-watchdog")},
        decode={"replicas": 2}, remediation=FAST,
    ))  # fmt: skip
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
    victim = pods(cluster, ns, "decode")[0]
    name = victim["metadata"]["name"]
    prefill_url = f"http://{pods(cluster, ns, 'prefill')[0]['status']['podIP']}:{WORKER_PORT}"
    token = admin_token(cluster, ns)
    loader = subprocess.Popen(
        [str(Path(sys.executable).parent / "pdworker"), "load", "--url", router_url(cluster, ns),
         "--clients", "8", "--duration", "60", "--prompt-len", "320", "--output-len", "2",
         "--timeout", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def bound_to_victim() -> Any:
            _, rooms = http("GET", prefill_url + "/admin/rooms", token=token)
            mine = [r for r in rooms if (r.get("peer") or {}).get("pod") == name]
            return mine or None

        bound = cluster.wait_until(f"rooms bound to {name}", bound_to_victim, 30)
        old_incarnation = bound[0]["peer"]["incarnation"]
        cluster.kubectl("delete", "pod", "-n", ns, name, "--grace-period=0", "--force")
    finally:
        loader.kill()
        loader.wait(timeout=10)

    def new_incarnation_up() -> Any:
        pod = get_json(cluster, ns, "pod", name)
        return (
            pod
            and pod["metadata"]["uid"] != victim["metadata"]["uid"]
            and pod_condition(pod, "Ready").get("status") == "True"
        )

    cluster.wait_until("the new decode incarnation", new_incarnation_up, 120)
    appeared = time.monotonic()

    def old_rooms_gone() -> bool:
        _, rooms = http("GET", prefill_url + "/admin/rooms", token=token)
        return not [r for r in rooms if (r.get("peer") or {}).get("incarnation") == old_incarnation]

    cluster.wait_until("rooms of the old incarnation failed", old_rooms_gone, 2 * SCRAPE + 10)
    took = time.monotonic() - appeared
    assert took <= 2 * SCRAPE + 5, f"rooms of the old incarnation lingered {took:.1f}s"
    m = scrape(prefill_url + "/metrics")
    assert m.get(pdw.PREFILL_INFLIGHT_QUEUE) == 0
    assert generate_when_routed(cluster, ns, "served by the new incarnation").get("ok") is True


def test_every_metric_the_chart_reads_appeared(cluster: Cluster) -> None:
    """Last in this module: each metric the chart's alerts and dashboard read was really
    observed (a non-zero value) by an operator of the scenarios above (each records what it
    served when it stops). A declared metric that no code path moves stays 0 forever, and its
    alert or panel is dead."""
    if not cluster.metrics_seen:
        pytest.skip("needs the scenarios above in the same session")
    read = promtool.chart_families(promtool.render_rules(cluster.helm_path))
    # Failure counters move only when something fails that no scenario here makes fail; each is
    # moved, and its alert fired, by a test that makes it fail (named), so here it must only be
    # one the operator declares.
    failure_only = {
        "pdwarden_operator_errors": "tests/shell (every loop-survival and contained-error test)",
        "pdwarden_scrape_refused": "tests/shell/test_shell_remediation.py (a body over the cap)",
    }
    declared = {promtool.family(m.name) for m in REGISTRY.collect()}  # pdwarden.metrics' own
    assert set(failure_only) <= declared & read, sorted(set(failure_only) - declared - read)
    missing = read - cluster.metrics_seen - set(failure_only)
    assert not missing, f"the chart reads metrics no operator really moved: {sorted(missing)}"
