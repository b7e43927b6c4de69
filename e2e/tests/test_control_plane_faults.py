"""The operator when its own world fails (issue 35): the API server, etcd, watch history.

A cluster of its own (module-scoped, apart from the session's `cluster`), so stopping its API
server or pausing its etcd breaks no other test. One PDDeployment of real pdworker pods serves
every scenario; each wedges one decode pod on purpose (the `decode-stall` fault switch, as in
test_remediation_scenarios.py), so a live wedge runs through the fault, and asserts what a user
sees: the ledger in status, pod conditions, Events, the operator's /metrics. Each prints its
figures (time to recover, time to repair), gathered at the end of the module into one table
(docs/faults.md quotes it). They run in file order: etcd paused, throttled, a node lost, watch
history compacted, API server killed; the last two restart the API server, after which they
check the operator's part of bringing a replaced pod back, not the test kubelet's
(`replacement_served`).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster.controlplane import LocalCluster, build_binaries
from e2e.faultkit import Kubectl, Reader, SeatHolder, ThrottledIdentity, etcd_compact, wait
from e2e.fixtures import (
    CRD_FILE,
    EXTERNAL_ENV,
    Cluster,
    OperatorProcess,
    create_namespace,
    wait_established,
)
from e2e.httpjson import http
from e2e.pdtools import (
    admin_token,
    apply,
    cpu_example,
    generate,
    pods,
    router_url,
    status,
    wait_ready,
)
from e2e.tests.test_remediation_scenarios import env, worker_pid

from pdwarden.constants import CONDITION_SERVING, LABEL_DEPLOYMENT, WORKER_PORT
from pdwarden.handlers.on_deployment import RETRY_DELAY
from pdwarden.k8s.client import DEFAULT_TIMEOUT
from pdworker.contract import DECODE_PREALLOC_QUEUE, DECODE_RUNNING, DECODE_TRANSFER_QUEUE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 1, 4, 5
CYCLE = SCRAPE  # a remediation cycle starts every scrapeIntervalSeconds
SLACK = 3.0  # polling, a kubelet status round and the 2-core box's scheduling, at most
READY = {"prefill": "1/1", "decode": "2/2", "router": "1/1"}
DEPLOYMENT = cpu_example(
    decode={"replicas": 2, "env": env("decode-stall")},
    remediation={
        "scrapeIntervalSeconds": SCRAPE, "wedgeAfterSeconds": WEDGE_AFTER,
        "restartAfterSeconds": RESTART_AFTER, "cooldownSeconds": 2,
        "maxUnavailableDecode": 1, "maxActionsPerHour": 200,
    },
)  # fmt: skip
# Two small PDDeployments for the watch-history scenario: one deleted, one created meanwhile.
GHOST = cpu_example("ghost", decode={"replicas": 1}, remediation={"scrapeIntervalSeconds": SCRAPE})
LATE = cpu_example("late", decode={"replicas": 1}, remediation={"scrapeIntervalSeconds": SCRAPE})
ERRORS = "pdwarden_operator_errors_total"
HELD = (DECODE_PREALLOC_QUEUE, DECODE_TRANSFER_QUEUE, DECODE_RUNNING)


@dataclass
class World:
    cluster: Cluster
    local: LocalCluster
    reader: Reader
    ns: str
    op: OperatorProcess
    logs: Path
    identity: ThrottledIdentity
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def deployment(self) -> dict[str, Any]:
        return self.reader.pdd(self.ns, "pd") or {}

    def ledger(self) -> list[dict[str, Any]]:
        rem = (self.deployment().get("status") or {}).get("remediation") or {}
        return list(rem.get("history") or [])


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[World]:
    if os.environ.get(EXTERNAL_ENV):
        pytest.skip("kills and pauses control-plane processes: needs a local cluster of its own")
    started = time.monotonic()
    bin_dir = build_binaries()
    local = LocalCluster(tmp_path_factory.mktemp("faults-cluster"), gpu_nodes=0, cpu_nodes=2)
    atexit.register(local.stop, quiet=True)
    try:
        local.start()
    except BaseException:
        local.stop(quiet=True)
        raise
    cluster = Cluster(kubeconfig=str(local.kubeconfig), bin_dir=bin_dir, local=local)
    op: OperatorProcess | None = None
    w: World | None = None
    identity: ThrottledIdentity | None = None
    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        wait_established(cluster, "pddeployments.pdwarden.dev")
        ns = create_namespace(cluster, "faults")
        logs = tmp_path_factory.mktemp("faults-logs")
        # The operator as the chart runs it: its ServiceAccount, least-privilege RBAC and
        # admission policy, and a token key (so it reads no Secret); APF can then single out
        # its requests (scenario 3).
        identity = ThrottledIdentity(
            Kubectl(cluster.kubectl_path, cluster.kubeconfig), cluster.helm_path, logs,
            namespace=f"{ns}-op", watch_namespaces=(ns,),
        )  # fmt: skip
        kubeconfig = identity.create(cluster.kubeconfig)
        key = logs / "token.key"
        key.write_text(secrets.token_hex(32))
        op = OperatorProcess(
            cluster, [ns], logs / "operator.log", f"--token-key-file={key}",
            env={"KUBECONFIG": kubeconfig},
        )  # fmt: skip
        op.start()
        apply(cluster, ns, DEPLOYMENT)
        apply(cluster, ns, GHOST)
        wait_ready(cluster, ns, READY)
        w = World(cluster, local, Reader(local.kubeconfig), ns, op, logs, identity)
        w.figures["setup"] = {"seconds": round(time.monotonic() - started, 1)}
        yield w
    finally:
        if op is not None:
            op.stop()
        if identity is not None:
            identity.close()
        local.stop(quiet=True)
        if w is not None:
            w.figures["module wall time"] = {"seconds": round(time.monotonic() - started, 1)}
            report(request, w.figures)


def report(request: pytest.FixtureRequest, figures: dict[str, dict[str, Any]]) -> None:
    """The figures of every scenario, on the terminal whatever the capture mode."""
    out = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", "control-plane faults: figures"]
    for name, values in figures.items():
        lines.append(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    for line in lines:
        if out is not None:
            out.write_line(line)
        else:
            print(line, file=sys.stderr)


# -- what every scenario reads ----------------------------------------------------------------


def serving_metrics(op: OperatorProcess, timeout: float = 60) -> None:
    """Wait until a just-started operator serves /metrics (it imports for seconds first)."""

    def up() -> bool:
        try:
            op.metrics_text()
        except OSError:
            assert op.proc and op.proc.poll() is None, f"the operator exited; log: {op.log_path}"
            return False
        return True

    wait("the operator's /metrics", up, timeout, every=0.3)


def errors_by_stage(op: OperatorProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in op.metrics_text().splitlines():
        if line.startswith(ERRORS + "{"):
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = float(line.rsplit(" ", 1)[1])
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in after.items() if v > before.get(k, 0)}


def decode(w: World, index: int) -> dict[str, Any]:
    return pods(w.cluster, w.ns, "decode")[index]


def serving(pod: dict[str, Any] | None) -> str | None:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION_SERVING:
            return str(c.get("status"))
    return None


def stall_and_load(
    w: World, victim: dict[str, Any], *args: str, name: str = "pd"
) -> subprocess.Popen[bytes]:
    """Wedge `victim` (its decode stops consuming KV) and start clients whose requests reach it
    (the router picks decode pods at random, among those its discovery listed) and stay stuck
    there."""
    ip = victim["status"]["podIP"]
    url = f"http://{ip}:{WORKER_PORT}"
    wait(  # listed by the router: a request served by it (right after setup it may not be)
        f"the router to send work to {victim['metadata']['name']}",
        lambda: generate(w.cluster, w.ns, "before the wedge", name).get("decode") == url,
        60,
        every=0.05,
    )
    code, body = http(
        "POST", f"http://{ip}:{WORKER_PORT}/admin/decode-stall", {},
        token=admin_token(w.cluster, w.ns, name),
    )  # fmt: skip
    assert code == 200, body
    with (w.logs / f"load-{name}.log").open("ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "pdworker"), "load", "--url",
             router_url(w.cluster, w.ns, name), "--clients", "4", *args],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stuck_requests(victim: dict[str, Any]) -> float:
    """Requests the wedged decode holds (its transfer queue), as its /metrics says."""
    code, text = http("GET", f"http://{victim['status']['podIP']}:{WORKER_PORT}/metrics")
    assert code == 200
    total = 0.0
    for line in str(text).splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] in HELD:
            total += float(line.rsplit(" ", 1)[1])
    return total


def when(entry: dict[str, Any]) -> float:
    """A ledger entry's decision time (whole seconds, UTC) as a Unix time."""
    return datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp()


def for_incarnation(entries: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("uid") == uid]


def cordoned(w: World, victim: dict[str, Any]) -> bool:
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    pod = w.reader.pod(w.ns, name)
    return pod is not None and (pod["metadata"]["uid"] != uid or serving(pod) == "False")


def replaced(w: World, victim: dict[str, Any]) -> bool:
    """The operator's delete, not the kubelet's termination, is what this sees."""
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    pod = w.reader.pod(w.ns, name)
    return pod is not None and (
        pod["metadata"]["uid"] != uid or bool(pod["metadata"].get("deletionTimestamp"))
    )


def repaired(w: World, victim: dict[str, Any], timeout: float) -> tuple[float, float]:
    """Wait for the cordon of `victim`'s incarnation, then its replacement; (the monotonic
    times each was first seen)."""
    name = victim["metadata"]["name"]
    _, t_cordon = wait(f"the cordon of {name}", lambda: cordoned(w, victim), timeout)
    _, t_restart = wait(f"the restart of {name}", lambda: replaced(w, victim), timeout)
    return t_cordon, t_restart


def first_seen(checks: dict[str, Any], timeout: float) -> dict[str, float]:
    """Poll every check until each has held once; the monotonic time each was first seen (so
    that one slow to come does not delay the timing of another)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(checks):
        missing = sorted(set(checks) - set(seen))
        assert time.monotonic() < deadline, f"timed out waiting for {missing}"
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.monotonic()
        time.sleep(0.1)
    return seen


def replacement_ready(w: World, victim: dict[str, Any], timeout: float = 120) -> float:
    """Wait until the restarted pod's new incarnation is Ready and the deployment Ready again;
    returns the monotonic time."""
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]

    def ready() -> bool:
        pod = w.reader.pod(w.ns, name) or {}
        conds = (pod.get("status") or {}).get("conditions") or []
        return pod.get("metadata", {}).get("uid", uid) != uid and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conds
        )

    wait(f"the new {name} Ready", ready, timeout)
    wait_ready(w.cluster, w.ns, READY, timeout=timeout)
    return time.monotonic()


def replacement_served(w: World, victim: dict[str, Any], timeout: float = 60) -> float:
    """Wait until the pod's new incarnation has the serving condition its readiness gate waits
    for: the operator's part of bringing it back (the monotonic time). Used where an API server
    restart came just before the pod was created: the local kubelet at times never starts such
    a pod (measured: 2 of 3 runs; the scheduler logged "Pod updated on a different node than
    previously added to"), which is the test cluster's failing, not the operator's. The
    scenarios that use it run last, so no other one waits on that pod."""
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]

    def served() -> bool:
        pod = w.reader.pod(w.ns, name) or {}
        return pod.get("metadata", {}).get("uid", uid) != uid and serving(pod) == "True"

    _, at = wait(f"the new {name} served", served, timeout)
    return at


def once_each(entries: list[dict[str, Any]], uid: str) -> dict[str, int]:
    """Performed actions on one incarnation, by kind; every entry id appears once."""
    ids = [e["id"] for e in entries if e.get("id")]
    assert len(ids) == len(set(ids)), f"a ledger entry is duplicated: {entries}"
    done: dict[str, int] = {}
    for e in for_incarnation(entries, uid):
        if e.get("outcome") == "Succeeded":
            done[e["action"]] = done.get(e["action"], 0) + 1
    return done


def events(w: World, reason: str) -> list[dict[str, Any]]:
    out = w.reader.get(f"/api/v1/namespaces/{w.ns}/events?fieldSelector=reason%3D{reason}")
    return list((out or {}).get("items") or [])


# -- 1. etcd paused ---------------------------------------------------------------------------

ETCD_PAUSE = 20.0  # seconds etcd is SIGSTOPped at least (the issue asks 20-60)
# etcd stays paused at least this long after the operator saw the wedge, so what it saw is
# older than the evidence limit (remediation.cycle.evidence_limit: 5 s here) when etcd returns.
STALE_BY = 8.0
WEDGES_SEEN = "pdwarden_wedges_detected_total"


def test_etcd_paused_errors_contained_and_no_stale_action(world: World) -> None:
    """etcd stops while a wedge is live: the operator sees the wedge, but every write hangs.
    Right then the wedge ends on its own (the wedged process dies; the kubelet starts it again,
    unwedged). When etcd returns, what the operator saw during the pause is no longer true and
    must not be acted on (before the fix the hung intent landed and the cordon followed). Then
    a fresh wedge is repaired."""
    w = world
    victim = decode(w, 1)
    uid = victim["metadata"]["uid"]
    pid, errors0 = w.op.proc.pid if w.op.proc else 0, errors_by_stage(w.op)
    cycles0 = w.op.metric("pdwarden_remediation_cycles_total")
    restarts0 = container_restarts(victim)
    loader = stall_and_load(w, victim, "--requests", "8", "--timeout", "60")
    try:
        wait("requests stuck on the stalled decode", lambda: stuck_requests(victim) > 0, 30)
        worker = worker_pid(victim)
        seen0 = w.op.metric(WEDGES_SEEN)
        w.local.pause("etcd")
        paused = time.monotonic()
        try:
            # The wedge matures (wedgeAfterSeconds) and the operator sees it (it counts the
            # finding before it posts the WedgeDetected Event and writes its intent, both of
            # which now hang); at that moment the wedge ends: its process dies, and the kubelet
            # starts it again, unwedged. What the operator saw is old news from then on.
            _, seen = wait(
                "the operator to see the wedge",
                lambda: w.op.metric(WEDGES_SEEN) > seen0,
                ETCD_PAUSE + 20,
            )
            os.kill(worker, signal.SIGKILL)
            alive_for(w, max(ETCD_PAUSE - (seen - paused), STALE_BY))
            # And until a call has failed for it: one made late in the pause is answered
            # when etcd returns unless its timeout (15 s) comes first (measured: the Event
            # posted as the wedge was seen, 7.7 s into a 20 s pause, was then answered).
            wait(
                "a call failed for the pause, counted",
                lambda: grown(errors0, errors_by_stage(w.op)),
                DEFAULT_TIMEOUT + 5,
                every=0.5,
            )
        finally:
            w.local.resume("etcd")
    finally:
        loader.kill()
        loader.wait(timeout=10)
    resumed = time.monotonic()
    _, ready = wait("kube-apiserver ready", w.reader.ready, 60, every=0.2)
    wait(
        "the victim's process started again",
        lambda: container_restarts(w.reader.pod(w.ns, victim["metadata"]["name"])) > restarts0,
        60,
    )
    # Cycles after etcd returned, each of which could have acted on what the pause showed.
    w.op.wait_cycles(WEDGE_AFTER + RESTART_AFTER)
    entries = w.ledger()
    acted = [e for e in for_incarnation(entries, uid) if e.get("outcome") != "Skipped"]
    assert not acted, f"acted on what the pause showed: {acted}"
    late = [e for e in for_incarnation(entries, uid) if e.get("outcome") == "Skipped"]
    errors = grown(errors0, errors_by_stage(w.op))
    assert errors, "the pause left no trace in pdwarden_operator_errors"
    assert w.op.proc and w.op.proc.poll() is None and w.op.proc.pid == pid
    cycles = w.op.metric("pdwarden_remediation_cycles_total") - cycles0

    # Recovery: the same pod, its new process stalled and loaded, is repaired.
    victim = w.reader.pod(w.ns, victim["metadata"]["name"]) or {}
    fresh, wall_fresh = time.monotonic(), time.time()
    loader = stall_and_load(w, victim, "--requests", "16", "--timeout", "60")
    try:
        t_cordon, t_restart = repaired(w, victim, 90)
    finally:
        loader.kill()
        loader.wait(timeout=10)
    replacement_ready(w, victim)
    entries = w.ledger()
    assert once_each(entries, uid) == {"CordonDecode": 1, "RestartDecode": 1}, entries
    performed = [e for e in for_incarnation(entries, uid) if e.get("outcome") == "Succeeded"]
    assert all(when(e) >= wall_fresh - 1 for e in performed), performed
    w.figures["1 etcd paused"] = {
        "paused_s": round(resumed - paused, 1),
        "wedge_seen_after_pause_s": round(seen - paused, 1),
        "api_ready_after_s": round(ready - resumed, 1),
        "cycles_during_and_after": int(cycles), "errors": errors,
        "late_intents_skipped": len(late),
        "fresh_wedge_cordon_s": round(t_cordon - fresh, 1),
        "fresh_wedge_restart_s": round(t_restart - fresh, 1),
    }  # fmt: skip


def alive_for(w: World, seconds: float) -> None:
    """Wait `seconds`, checking every second that the operator lives and serves /metrics."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert w.op.proc and w.op.proc.poll() is None, "the operator exited"
        w.op.metrics_text()
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def container_restarts(pod: dict[str, Any] | None) -> int:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in statuses)


# -- 2. the operator throttled by API Priority and Fairness -----------------------------------

# Every seat of the operator's level is held for this many of the deployment's cycles: the
# wedge matures (wedgeAfterSeconds) and ten or more follow that would each have acted, had their
# writes not been refused.
HELD_CYCLES = round(WEDGE_AFTER / CYCLE) + 10 + 3
# What a held connection asks for: a list of ConfigMaps twice as large as the most a socket
# buffers here (tcp_wmem's 4 MiB), so the API server's handler blocks writing it.
BALLAST_MAPS, BALLAST_BYTES = 8, 1_000_000
BALLAST_PATH = "/api/v1/namespaces/{ns}/configmaps"
# Requests the operator may make per cycle while each is refused: an intent, an Event and a
# status write per deployment (two here), kopf's retries of its own. A client that retried at
# once would make hundreds.
REFUSED_PER_CYCLE = 8


def kopf_longest_wait(held: float) -> float:
    """The longest kopf may still sleep, after `held` seconds in which every request was
    refused, before it tries a refused request of its own again: the largest of its error
    back-off steps (its settings, which pdwarden leaves alone) that can have begun in `held`."""
    import kopf

    steps = kopf.OperatorSettings().networking.error_backoffs
    assert isinstance(steps, (list, tuple))
    longest, begun = 0.0, 0.0
    for step in steps:
        if begun >= held:
            break
        longest, begun = max(longest, float(step)), begun + float(step)
    return longest


def change_spec(w: World) -> int:
    """Change a harmless field of the spec; the new generation."""
    obj = w.deployment()
    budget = (obj["spec"].get("remediation") or {}).get("maxActionsPerHour", 200)
    out = w.cluster.kubectl(
        "patch", "pdd", "pd", "-n", w.ns, "--type=merge", "-o", "json",
        "-p", json.dumps({"spec": {"remediation": {"maxActionsPerHour": budget + 1}}}),
    ).stdout  # fmt: skip
    return int(json.loads(out)["metadata"]["generation"])


def observed(w: World, generation: int) -> bool:
    return ((w.deployment().get("status") or {}).get("observedGeneration") or 0) >= generation


def generation_observed(w: World) -> float:
    """Change the spec and wait until the operator's status observes the new generation: proof
    that its PDDeployment watch (kopf's) is live. Returns the seconds."""
    t0 = time.monotonic()
    generation = change_spec(w)
    wait("the new generation observed", lambda: observed(w, generation), 60)
    return round(time.monotonic() - t0, 1)


def ballast(w: World, ns: str) -> None:
    """ConfigMaps in `ns` that make its list far larger than a socket buffers."""
    for i in range(BALLAST_MAPS):
        w.cluster.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"ballast-{i}", "namespace": ns},
            "data": {"x": "x" * BALLAST_BYTES},
        }))  # fmt: skip


def test_operator_throttled_by_priority_and_fairness(world: World) -> None:
    """The running operator's requests (its ServiceAccount) are moved onto a priority level of
    the smallest share (3 seats here) that rejects (429) whatever finds its seats taken. A
    neighbour on that level takes every seat (`SeatHolder`) while a wedge matures and a spec
    change waits: every request the operator makes is refused. It contains the refusals, backs
    off (no storm of retries), acts on nothing, loses no status write or ledger entry, and once
    the seats are free repairs the wedge and observes the change within stated bounds."""
    w = world
    identity = w.identity
    token = identity.neighbour_token()
    ballast(w, identity.namespace)
    figures: dict[str, Any] = {}
    w.figures["2 throttled (APF, every seat taken)"] = figures
    errors0 = errors_by_stage(w.op)
    identity.throttle()
    try:
        seats, _ = wait("the tiny level's seats", lambda: identity.seats(w.reader), 30, every=0.5)
        figures["level_seats"] = seats
        victim = decode(w, 1)
        uid = victim["metadata"]["uid"]
        loader = stall_and_load(w, victim, "--requests", "16", "--timeout", "60")
        try:
            path = BALLAST_PATH.format(ns=identity.namespace)
            neighbour = identity.neighbour_schema
            with SeatHolder(w.reader, token, path, seats) as holder:
                try:
                    holder.hold(lambda: identity.executing_seats(w.reader, neighbour))
                except AssertionError as e:
                    raise AssertionError(f"{e}; level {identity.level(w.reader)}") from None
                held, before = time.monotonic(), identity.requests(w.reader)
                seen0 = w.op.metric(WEDGES_SEEN)
                generation = change_spec(w)
                start = cycles_of(w.op, "pd")
                while (cycles_held := cycles_of(w.op, "pd") - start) < HELD_CYCLES:
                    assert holder.probe() == 429, "the level let a request through"
                    assert serving(w.reader.pod(w.ns, victim["metadata"]["name"])) != "False"
                    wait("a cycle of pd while held",
                         lambda n=cycles_held: cycles_of(w.op, "pd") - start > n,
                         10 * CYCLE + SLACK, every=0.2)  # fmt: skip
                seen = w.op.metric(WEDGES_SEEN) - seen0
                during = identity.requests(w.reader)
                assert not observed(w, generation), "a status write got through held seats"
            released = time.monotonic()
            refused = during.get(identity.schema, {}).get("rejected", 0) - before.get(
                identity.schema, {}
            ).get("rejected", 0)
            seen_at = first_seen({
                "status": lambda: observed(w, generation),
                "cordon": lambda: cordoned(w, victim),
                "restart": lambda: replaced(w, victim),
            }, 60)  # fmt: skip
            t_observed, t_cordon, t_restart = (seen_at[k] for k in ("status", "cordon", "restart"))
        finally:
            loader.kill()
            loader.wait(timeout=10)
        replacement_ready(w, victim)
        w.op.wait_cycles(3)
        figures.update({
            "held_s": round(released - held, 1), "wedges_seen_while_held": int(seen),
            "cycles_held": int(cycles_held), "operator_refused": refused,
            "refused_per_cycle": round(refused / cycles_held, 1),
            "retry_after": sorted(holder.retry_after),
            "errors": grown(errors0, errors_by_stage(w.op)),
            "status_write_after_release_s": round(t_observed - released, 1),
            "cordon_after_release_s": round(t_cordon - released, 1),
            "restart_after_release_s": round(t_restart - released, 1),
        })  # fmt: skip
        print(f"throttled: {figures}", flush=True)
        assert refused > 0, "the operator made no request while the seats were held"
        assert refused <= REFUSED_PER_CYCLE * cycles_held, f"no back-off: {refused} refused"
        entries = w.ledger()
        assert once_each(entries, uid) == {"CordonDecode": 1, "RestartDecode": 1}, entries
        # Every action Event is named after its ledger entry (pd.<id>): none without its entry.
        ids = {e.get("id") for e in entries}
        for reason in ("CordonDecode", "RestartDecode", "UncordonDecode"):
            for ev in events(w, reason):
                if ev["involvedObject"]["kind"] == "PDDeployment":
                    assert ev["metadata"]["name"].rsplit(".", 1)[1] in ids, ev["metadata"]["name"]
        assert not [e for e in entries if e.get("outcome") == "Pending"], entries
        assert w.op.proc and w.op.proc.poll() is None
        # kopf sleeps its back-off step, or the Retry-After the API server asked when longer,
        # before it stores the failed handler's retry; the handler then runs RETRY_DELAY later.
        asked = max(float(v) for v in holder.retry_after)
        status_bound = max(kopf_longest_wait(released - held), asked) + RETRY_DELAY + SLACK
        assert t_observed - released <= status_bound, f"status after {t_observed - released:.1f}s"
        assert t_cordon - released <= 2 * CYCLE + SLACK, f"cordon after {t_cordon - released:.1f}s"
    finally:
        identity.unthrottle()
        w.cluster.kubectl("delete", "configmap", "-n", identity.namespace, "--all", check=False)


# -- 5. a node lost ---------------------------------------------------------------------------

# The node lifecycle controller marks a silent node's pods not Ready 50 s (its default grace)
# after the last lease renewal it saw, itself up to 10 s old, checked every 5 s: the far
# deployment's wedge matures well after that, so it is judged while its node is known lost.
FAR_WEDGE_AFTER = 75
FAR_NODE = "far-gpu-node-0"  # the extra kubelet's one node (--node-prefix far-)


def wedged_message(w: World, name: str) -> str:
    st = (w.reader.pdd(w.ns, name) or {}).get("status") or {}
    cond = next((c for c in st.get("conditions") or [] if c.get("type") == "Wedged"), {})
    return str(cond.get("message") or "")


def test_a_lost_nodes_pods_are_left_to_kubernetes_and_the_rest_is_repaired(world: World) -> None:
    """A second kubelet's node carries a whole PDDeployment (`far`); its decode is stalled under
    load, then that kubelet is frozen (SIGSTOP: its lease stops, its pods' processes run on and
    still answer). The node controller marks far's pods not Ready; pdwarden judges them unknown
    and says why (the Wedged condition), takes no action on them though their wedge matures, and
    meanwhile repairs a wedge on the healthy nodes. The kubelet back, the wedge is judged again
    and repaired: it was real, so the restraint was pdwarden's, not a missed wedge."""
    from e2e.tests.test_kubelet_lifecycle import start_kubelet

    w = world
    state = w.logs / "far-kubelet"
    state.mkdir()
    kubelet = start_kubelet(w.cluster, state, "far-")
    loader: subprocess.Popen[bytes] | None = None
    try:
        wait("the far node registered", lambda: w.reader.get(f"/api/v1/nodes/{FAR_NODE}"), 60)
        pinned = {"nodeSelector": {"kubernetes.io/hostname": FAR_NODE}}
        apply(w.cluster, w.ns, cpu_example(
            "far", prefill=pinned, router=pinned,
            decode={"replicas": 2, "env": env("decode-stall"), **pinned},
            remediation={
                "scrapeIntervalSeconds": SCRAPE, "wedgeAfterSeconds": FAR_WEDGE_AFTER,
                "restartAfterSeconds": RESTART_AFTER, "cooldownSeconds": 2,
                "maxUnavailableDecode": 1, "maxActionsPerHour": 200,
            },
        ))  # fmt: skip
        wait_ready(
            w.cluster, w.ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, name="far"
        )
        victim = pods(w.cluster, w.ns, "decode", "far")[0]
        assert victim["spec"]["nodeName"] == FAR_NODE, victim["spec"]
        loader = stall_and_load(w, victim, "--requests", "8", "--timeout", "300", name="far")
        wait("requests stuck on far's decode", lambda: stuck_requests(victim) > 0, 30)
        stalled = time.monotonic()
        kubelet.send_signal(signal.SIGSTOP)
        try:
            far = [*pods(w.cluster, w.ns, "prefill", "far"), victim]

            def marked() -> bool:
                now = [w.reader.pod(w.ns, p["metadata"]["name"]) or {} for p in far]
                return all(
                    any(c.get("type") == "Ready" and c.get("status") == "False"
                        for c in (p.get("status") or {}).get("conditions") or [])
                    for p in now
                )  # fmt: skip

            _, t_marked = wait("the node controller marks far's pods not Ready", marked, 120)
            assert t_marked - stalled < FAR_WEDGE_AFTER, "marked after the wedge matured"
            wait("far's Wedged condition to name the lost node",
                 lambda: "stopped reporting" in wedged_message(w, "far"), 30)  # fmt: skip

            # The healthy nodes' wedge is repaired meanwhile.
            near = decode(w, 1)
            fresh = time.monotonic()
            near_loader = stall_and_load(w, near, "--requests", "16", "--timeout", "60")
            try:
                t_cordon, _ = repaired(w, near, 90)
            finally:
                near_loader.kill()
                near_loader.wait(timeout=10)
            replacement_ready(w, near)

            # far's wedge matured while its node was lost, and cycles ran on it since.
            wait("far's wedge older than wedgeAfterSeconds",
                 lambda: time.monotonic() - stalled > FAR_WEDGE_AFTER + 2 * CYCLE,
                 FAR_WEDGE_AFTER + 30)  # fmt: skip
            start = cycles_of(w.op, "far")
            wait("three more cycles of far", lambda: cycles_of(w.op, "far") >= start + 3, 60)
            message = wedged_message(w, "far")
            assert not (status(w.cluster, w.ns, "far").get("remediation") or {}).get("history")
            assert stuck_requests(victim) > 0  # still wedged, and still untouched
            now = w.reader.pod(w.ns, victim["metadata"]["name"]) or {}
            assert now["metadata"]["uid"] == victim["metadata"]["uid"]
            assert not now["metadata"].get("deletionTimestamp") and serving(now) == "True"
        finally:
            kubelet.send_signal(signal.SIGCONT)
        resumed, wall_resumed = time.monotonic(), time.time()

        def far_cordoned() -> bool:
            entries = status(w.cluster, w.ns, "far").get("remediation") or {}
            return any(
                e["action"] == "CordonDecode" and e.get("uid") == victim["metadata"]["uid"]
                and e.get("outcome") == "Succeeded"
                for e in entries.get("history") or []
            )  # fmt: skip

        try:
            _, t_far = wait("far's decode cordoned once its node is back", far_cordoned, 90)
        except AssertionError:
            back = w.reader.pod(w.ns, victim["metadata"]["name"]) or {}
            print(f"far: {wedged_message(w, 'far')}; {victim['metadata']['name']}: "
                  f"{(back.get('status') or {}).get('conditions')}", flush=True)  # fmt: skip
            raise
        entries = (status(w.cluster, w.ns, "far").get("remediation") or {}).get("history") or []
        assert all(when(e) >= wall_resumed - 1 for e in entries), entries
    finally:
        if loader is not None:
            loader.kill()
            loader.wait(timeout=10)
        kubelet.send_signal(signal.SIGCONT)
        w.cluster.kubectl("delete", "pdd", "far", "-n", w.ns, "--wait=true", "--timeout=60s",
                          check=False)  # fmt: skip
        kubelet.terminate()
        kubelet.wait(timeout=30)
        w.cluster.kubectl("delete", "node", FAR_NODE, "--wait=false", check=False)
    w.figures["5 node lost"] = {
        "marked_not_ready_after_s": round(t_marked - stalled, 1),
        "near_wedge_cordon_s": round(t_cordon - fresh, 1),
        "far_repaired_after_node_back_s": round(t_far - resumed, 1),
        "condition": message[:160],
    }  # fmt: skip


# -- 3. watch history compacted while the operator's watches are down --------------------------


def pause_operator(op: OperatorProcess) -> None:
    assert op.proc is not None
    os.killpg(op.proc.pid, signal.SIGSTOP)


def resume_operator(op: OperatorProcess) -> None:
    assert op.proc is not None
    os.killpg(op.proc.pid, signal.SIGCONT)


def of_deployment(w: World, resource: str, name: str) -> list[dict[str, Any]]:
    """Objects (`resource` is an API path's tail, e.g. "apps/v1/statefulsets") labelled as
    children of the PDDeployment `name`."""
    group = "api/v1" if resource == "pods" else f"apis/{resource.rsplit('/', 1)[0]}"
    plural = resource.rsplit("/", 1)[-1]
    sel = f"{LABEL_DEPLOYMENT}%3D{name}"
    out = w.reader.get(f"/{group}/namespaces/{w.ns}/{plural}?labelSelector={sel}")
    assert out is not None, f"cannot list {resource}"
    return list(out.get("items") or [])


def watch_expired(w: World, path: str, version: str) -> str:
    """What a watch resumed from `version` is answered: "" when it is refused as too old (410
    Gone), as the operator's own watches are when they reconnect; else the answer."""
    try:
        text = w.reader.text(f"{path}?watch=1&resourceVersion={version}&timeoutSeconds=1")
    except urllib.error.HTTPError as e:
        return "" if e.code == 410 else f"HTTP {e.code}"
    return "" if '"code":410' in text else f"{text[:600]!r}"


def cycles_of(op: OperatorProcess, name: str) -> float:
    """Remediation cycles the operator finished for the PDDeployment `name` (failed ones
    included; 0: no series)."""
    return op.metric("pdwarden_remediation_cycles_total", name=name)


def test_watch_history_compacted_while_the_operator_is_stopped(world: World) -> None:
    """The operator is frozen (SIGSTOP) while its watches' connections break (the API server
    restarts), a PDDeployment is deleted (its finalizer released by hand, as an admin does when
    the operator is down), a decode pod is replaced, another PDDeployment is created, and etcd's
    history is compacted: the watches must list again. Nothing deleted may be scraped, acted on
    or recreated; what was created must be adopted."""
    w = world
    ghost = w.reader.pdd(w.ns, "ghost")
    assert ghost is not None and cycles_of(w.op, "ghost") > 0, "the ghost-to-be is not managed"
    old = decode(w, 0)
    pods_path = f"/api/v1/namespaces/{w.ns}/pods"
    version = (w.reader.get(pods_path + "?limit=1") or {})["metadata"]["resourceVersion"]
    pause_operator(w.op)
    stopped = time.monotonic()
    try:
        # A write after the operator's last: the restarted API server's watch cache then starts
        # past every version the operator's watches hold, as after its own compaction.
        w.cluster.kubectl("create", "configmap", f"fence-{int(time.time())}", "-n", w.ns)
        w.local.kill("kube-apiserver")
        w.local.start_again("kube-apiserver")
        wait("kube-apiserver ready again", w.reader.ready, 120, every=0.2)
        w.cluster.kubectl("delete", "pdd", "ghost", "-n", w.ns, "--wait=false")
        w.cluster.kubectl(
            "patch", "pdd", "ghost", "-n", w.ns, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}',
        )  # fmt: skip
        wait("the ghost deleted", lambda: w.reader.pdd(w.ns, "ghost") is None, 30)
        wait(
            "the ghost's workloads collected",
            lambda: not of_deployment(w, "apps/v1/statefulsets", "ghost"),
            60,
        )
        w.cluster.kubectl("delete", "pod", old["metadata"]["name"], "-n", w.ns, "--wait=false")
        wait(
            "the decode pod replaced",
            lambda: (
                (w.reader.pod(w.ns, old["metadata"]["name"]) or {})
                .get("metadata", {})
                .get("uid", old["metadata"]["uid"])
                != old["metadata"]["uid"]
            ),
            60,
        )
        apply(w.cluster, w.ns, LATE)
        compacted = etcd_compact(w.local.etcd_url())
        answer = watch_expired(w, pods_path, version)
        assert not answer, f"a watch from {version} still resumes: {answer}"
    finally:
        resume_operator(w.op)
    resumed = time.monotonic()
    try:

        def adopted() -> bool:
            late = w.reader.pdd(w.ns, "late") or {}
            st = late.get("status") or {}
            return bool(late) and st.get("observedGeneration") == late["metadata"]["generation"]

        _, t_adopted = wait("the new PDDeployment adopted", adopted, 60)
        assert of_deployment(w, "apps/v1/statefulsets", "late")
        t_ready = replacement_served(w, old)  # the decode pod replaced meanwhile is seen
        # Cycles enough for a ghost's daemons to scrape, act or re-apply; then nothing of it.
        ghost_cycles = cycles_of(w.op, "ghost")
        w.op.wait_cycles(WEDGE_AFTER + 2)
        recreated = [
            o["metadata"]["name"]
            for r in ("apps/v1/statefulsets", "apps/v1/deployments", "pods")
            for o in of_deployment(w, r, "ghost")
            if not o["metadata"].get("deletionTimestamp")  # still going since the deletion
        ]
        assert not recreated, f"children of the deleted PDDeployment came back: {recreated}"
        assert cycles_of(w.op, "ghost") <= ghost_cycles, "the deleted PDDeployment is still cycled"
        assert not for_incarnation(w.ledger(), old["metadata"]["uid"]), "acted on the replaced pod"
    finally:
        w.cluster.kubectl("delete", "pdd", "late", "-n", w.ns, "--wait=false")
    w.figures["3 watch history compacted"] = {
        "operator_stopped_s": round(resumed - stopped, 1), "etcd_compacted_at": compacted,
        "new_deployment_adopted_s": round(t_adopted - resumed, 1),
        "replaced_pod_served_s": round(t_ready - resumed, 1),
    }  # fmt: skip


# -- 4. kube-apiserver restarted mid-cycle (last: see replacement_served) ----------------------

API_DOWN = 10.0  # seconds the API server stays dead at least (the issue asks 10-30)


def test_apiserver_killed_while_a_wedge_is_live(world: World) -> None:
    w = world
    victim = decode(w, 0)
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    pid, errors0 = w.op.proc.pid if w.op.proc else 0, errors_by_stage(w.op)
    loader = stall_and_load(w, victim, "--requests", "16", "--timeout", "60")
    try:
        wait("requests stuck on the stalled decode", lambda: stuck_requests(victim) > 0, 30)
        assert not for_incarnation(w.ledger(), uid), "acted before the fault: nothing to test"
        w.local.kill("kube-apiserver")
        killed, wall_killed = time.monotonic(), time.time()

        # The wedge matures (wedgeAfterSeconds) while the API server is gone: it stays gone
        # until the operator has decided to act and could not record the intent (its intent
        # errors grew), and API_DOWN seconds at least; the operator lives through it and keeps
        # answering /metrics.
        def refused_and_long_enough() -> bool:
            assert w.op.proc and w.op.proc.poll() is None, "the operator exited"
            intents = errors_by_stage(w.op).get("intent", 0) - errors0.get("intent", 0)
            return intents > 0 and time.monotonic() - killed >= API_DOWN

        wait("an action the operator could not record", refused_and_long_enough, 60, every=0.5)
        wall_started = time.time()
        w.local.start_again("kube-apiserver")
        # Back: it serves the PDDeployment again (it accepts requests before /readyz says ok;
        # a starting server may also hold a request, hence the short timeout per poll).
        _, back = wait(
            "kube-apiserver serving again", lambda: w.reader.pdd(w.ns, "pd", 1.0), 120, every=0.1
        )
        t_cordon, t_restart = repaired(w, victim, 90)
    finally:
        loader.kill()
        loader.wait(timeout=10)
    recovered = replacement_served(w, victim)
    resumed = generation_observed(w)

    entries = w.ledger()
    done = once_each(entries, uid)
    assert done == {"CordonDecode": 1, "RestartDecode": 1}, entries
    # Nothing was decided while the API server was gone (decisions were made every cycle, and
    # not one was taken: its intent could not be recorded), nor on the view from before it. A
    # decision's time is whole seconds, hence the 1 s: an entry stamped before `wall_started`
    # minus 1 was decided before the new API server process existed.
    early = [e for e in entries if wall_killed - 1 <= when(e) < wall_started - 1]
    assert not early, f"decided while the API server was down: {early}"
    assert w.op.proc and w.op.proc.poll() is None and w.op.proc.pid == pid
    errors = grown(errors0, errors_by_stage(w.op))
    assert errors, "the outage left no trace in pdwarden_operator_errors"
    assert events(w, "CordonDecode") and events(w, "RestartDecode")
    to_cordon, to_restart = t_cordon - back, t_restart - back
    assert to_cordon <= WEDGE_AFTER + 2 * CYCLE + SLACK, f"cordon {to_cordon:.1f}s after the API"
    assert t_restart - t_cordon <= RESTART_AFTER + 2 * CYCLE + SLACK
    w.figures["4 apiserver killed"] = {
        "api_down_s": round(back - killed, 1), "cordon_after_api_s": round(to_cordon, 1),
        "restart_after_api_s": round(to_restart, 1),
        "replacement_served_after_api_s": round(recovered - back, 1),
        "spec_change_observed_s": resumed, "errors": errors, "victim": name,
    }  # fmt: skip
