"""Nothing lost: the active replica is SIGKILLed inside an action; the standby completes the record.

Real replicas peered through kopf on the real API server, real pdworker pods. The active replica
runs with PDWARDEN_FAULT_KILL_AT=<point>:CordonDecode, so it kills itself exactly there:
- intent: the Pending entry is on the API server, the pod was never cordoned;
- action: the pod is cordoned, neither the ledger entry nor an Event says so;
- event: the Event on the PDDeployment is posted, the ledger still says Pending.
After each death the standby (no switch) takes over and must leave exactly one performed
CordonDecode in the ledger for the pod, one CordonDecode Event for it on the PDDeployment, and an
actionsLastHour that counts what was performed. Each point gets a fresh killer of a higher
priority than the standby; one deployment with four decode pods serves the three points.
Its in-process twin, every outcome set up exactly: tests/shell/test_shell_ledger_recovery.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess, peering
from e2e.pdtools import (
    apply,
    cpu_example,
    get_json,
    history,
    pod_condition,
    pods,
    router_url,
    status,
    wait_ready,
)
from e2e.tests.test_remediation_scenarios import FAST, env, load, stall

from pdwarden.constants import CONDITION_SERVING, KIND
from pdwarden.remediation.cycle import KILL_AT_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
POINTS = ("intent", "action", "event")
LIFETIME = 15  # --peering-lifetime: how long a dead peer's heartbeat keeps the standby paused
READY = {"prefill": "1/1", "decode": "4/4", "router": "1/1"}


def peered(cluster: Cluster, ns: str, log: Path, priority: int, **env: str) -> OperatorProcess:
    ha = ("--peering=pdwarden", f"--peering-lifetime={LIFETIME}", f"--priority={priority}")
    return OperatorProcess(cluster, [ns], log, *ha, env=env).start()


def cycles(op: OperatorProcess) -> float:
    try:
        return op.metric("pdwarden_remediation_cycles_total")
    except OSError:
        return -1.0  # not answering yet


def take_over(cluster: Cluster, killer: OperatorProcess, standby: OperatorProcess) -> None:
    """Wait until the killer runs cycles and the standby, having seen it, runs none."""
    cluster.wait_until("the new replica's first cycles", lambda: cycles(killer) >= 2, 90)
    deadline = time.monotonic() + 60
    while True:
        before = cycles(standby)
        killer.wait_cycles(2)
        if cycles(standby) == before:
            return
        assert time.monotonic() < deadline, "the standby kept running cycles beside the killer"


def cordoned(cluster: Cluster, ns: str, name: str) -> bool:
    pod = get_json(cluster, ns, "pod", name)
    return bool(pod) and pod_condition(pod, CONDITION_SERVING).get("status") == "False"


def cordon_events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = get_json(cluster, ns, "events", "--field-selector", "reason=CordonDecode")["items"]
    return [e for e in items if e["involvedObject"]["kind"] == KIND and f" {name}:" in e["message"]]


def test_a_replica_killed_inside_an_action_loses_nothing(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> None:
    ns = namespace
    peering(cluster, ns)
    standby = peered(cluster, ns, tmp_path / "standby.log", 100)
    killers: list[OperatorProcess] = []
    doc = cpu_example(
        decode={"replicas": 4, "env": env("decode-stall")},
        # No restarts inside the test: each victim stays cordoned, three of the four at the end.
        remediation={**FAST, "maxUnavailableDecode": 3, "restartAfterSeconds": 3600,
                     "cooldownSeconds": 1, "maxActionsPerHour": 100},
    )  # fmt: skip
    try:
        apply(cluster, ns, doc)
        wait_ready(cluster, ns, READY, timeout=240)
        for i, point in enumerate(POINTS):
            victim = next(
                p["metadata"]["name"]
                for p in pods(cluster, ns, "decode")
                if not cordoned(cluster, ns, p["metadata"]["name"])
            )
            killer = peered(cluster, ns, tmp_path / f"killer-{point}.log", 200 + 100 * i,
                            **{KILL_AT_ENV: f"{point}:CordonDecode"})  # fmt: skip
            killers.append(killer)
            take_over(cluster, killer, standby)
            stall(cluster, ns, get_json(cluster, ns, "pod", victim))
            deadline = time.monotonic() + 60
            while killer.proc is not None and killer.proc.poll() is None:
                assert time.monotonic() < deadline, f"{point}: the killer never cordoned {victim}"
                load(router_url(cluster, ns), "--clients", "4", "--requests", "8", "--timeout", "3")
            assert killer.proc is not None and killer.proc.returncode == -9, killer.log()
            assert f"{KILL_AT_ENV}={point}:CordonDecode" in killer.log()

            def settled(victim: str = victim) -> Any:
                mine = [e for e in history(cluster, ns) if e["pod"] == victim]
                done = [e for e in mine if e["outcome"] == "Succeeded"]
                unsettled = [e for e in mine if e["outcome"] == "Pending"]
                return done and not unsettled and cordoned(cluster, ns, victim) and mine

            # The standby waits out the dead peer's heartbeat, then the intent's settling time.
            mine = cluster.wait_until(f"{point}: the standby settles {victim}", settled, 120)
            standby.wait_cycles(2)  # nothing is added late: a second cycle made no new entry
            mine = [e for e in history(cluster, ns) if e["pod"] == victim]
            outcomes = [(e["action"], e["outcome"]) for e in mine]
            if point == "intent":  # the cordon never ran: settled as not performed, then done
                assert outcomes == [("CordonDecode", "Skipped"), ("CordonDecode", "Succeeded")]
                assert "not performed" in mine[0]["reason"]
            else:  # it ran: recorded once, from what the pod shows
                assert outcomes == [("CordonDecode", "Succeeded")], outcomes
                assert "recovered after a failover" in mine[0]["reason"]
            assert len(cordon_events(cluster, ns, victim)) == 1, cordon_events(cluster, ns, victim)
        entries = history(cluster, ns)
        counted = [
            e for e in entries if e["outcome"] != "Skipped" and e["action"] != "UncordonDecode"
        ]
        rem = status(cluster, ns)["remediation"]
        assert rem["actionsLastHour"] == len(counted), json.dumps(entries, indent=1)
        assert not [e for e in entries if e["outcome"] == "Pending"]
        assert "Traceback" not in standby.log()
    finally:
        for op in (*killers, standby):
            op.stop()
