"""The operator against a real API server, with real pdworker pods run by the local kubelet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess, peering
from e2e.pdtools import (
    CHILDREN,
    CHILDREN_KINDS,
    apply,
    condition,
    cpu_example,
    generate_when_routed,
    get_json,
    status,
    wait_ready,
)

from pdwarden.constants import LABEL_ROLE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_apply_cpu_example_runs_serves_scales_rolls_and_cleans_up(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    ns = namespace
    apply(cluster, ns, cpu_example())
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})

    # Everything it made is owned by the PDDeployment, so deletion garbage-collects it.
    uid = get_json(cluster, ns, "pdd", "pd")["metadata"]["uid"]
    children = get_json(cluster, ns, CHILDREN, "-l", "pdwarden.dev/deployment=pd")["items"]
    kinds = sorted({c["kind"] for c in children})
    assert kinds == sorted(CHILDREN_KINDS)
    for child in children:
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid], child["kind"]

    # The router serves a request end to end: real KV moved prefill -> decode over NIXL.
    answer = generate_when_routed(cluster, ns, "hello pdwarden")
    assert answer.get("ok") is True, answer
    assert answer["decode"] != answer["prefill"]

    # Scale decode 2 -> 3 -> 1: only the decode StatefulSet changes.
    prefill_gen = get_json(cluster, ns, "sts", "pd-prefill")["metadata"]["generation"]
    cluster.kubectl("scale", "-n", ns, "pdd/pd", "--replicas=3")
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "3/3", "router": "1/1"})
    cluster.kubectl("patch", "-n", ns, "pdd/pd", "--type=merge", "-p",
                    '{"spec": {"decode": {"replicas": 1}}}')  # fmt: skip
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "1/1", "router": "1/1"})
    assert get_json(cluster, ns, "sts", "pd-prefill")["metadata"]["generation"] == prefill_gen

    # An env change rolls only the decode role; status says Progressing, then Ready.
    decode_uids = {
        p["metadata"]["uid"]
        for p in get_json(cluster, ns, "pods", "-l", "pdwarden.dev/role=decode")["items"]
    }
    prefill_uids = {
        p["metadata"]["uid"]
        for p in get_json(cluster, ns, "pods", "-l", "pdwarden.dev/role=prefill")["items"]
    }
    env = {"spec": {"decode": {"env": [{"name": "ROLLME", "value": "1"}]}}}
    cluster.kubectl("patch", "-n", ns, "pdd/pd", "--type=merge", "-p", json.dumps(env))
    cluster.wait_until(
        "Progressing=True during the rollout",
        lambda: condition(status(cluster, ns), "Progressing").get("status") == "True",
        60,
    )
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "1/1", "router": "1/1"})
    pods = get_json(cluster, ns, "pods", "-l", "pdwarden.dev/deployment=pd")["items"]
    new_decode = {
        p["metadata"]["uid"] for p in pods if p["metadata"]["labels"][LABEL_ROLE] == "decode"
    }
    new_prefill = {
        p["metadata"]["uid"] for p in pods if p["metadata"]["labels"][LABEL_ROLE] == "prefill"
    }
    assert new_decode.isdisjoint(decode_uids)
    assert new_prefill == prefill_uids
    assert generate_when_routed(cluster, ns, "after the rollout").get("ok") is True

    # Delete: everything it owned is garbage-collected.
    cluster.kubectl("delete", "-n", ns, "pdd/pd", "--wait=true", "--timeout=60s")
    cluster.wait_until(
        "owned objects garbage-collected",
        lambda: (
            not get_json(cluster, ns, f"{CHILDREN},pods", "-l", "pdwarden.dev/deployment=pd")[
                "items"
            ]
        ),
        90,
    )


def test_crash_looping_decode_is_degraded_with_pod_and_reason(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    doc = cpu_example()
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["decode"]["args"] = ["--no-such-flag"]
    apply(cluster, namespace, doc)

    def degraded() -> Any:
        st = status(cluster, namespace)
        cond = condition(st, "Degraded")
        return st.get("phase") == "Degraded" and cond.get("status") == "True" and cond

    cond = cluster.wait_until("Degraded condition", degraded, 120)
    assert "pd-decode-0" in cond["message"]
    assert "CrashLoopBackOff" in cond["message"] or "Error" in cond["message"]
    assert condition(status(cluster, namespace), "Ready")["status"] == "False"


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> None:
    first = OperatorProcess(cluster, [namespace], tmp_path / "op1.log").start()
    apply(cluster, namespace, cpu_example())
    cluster.wait_until(
        "the first operator to start creating children",
        lambda: get_json(cluster, namespace, "secret", "pd-admin") is not None,
        60,
    )
    first.kill(9)
    token = get_json(cluster, namespace, "secret", "pd-admin")["data"]["token"]
    second = OperatorProcess(cluster, [namespace], tmp_path / "op2.log").start()
    try:
        wait_ready(cluster, namespace, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
        children = get_json(cluster, namespace, CHILDREN, "-l", "pdwarden.dev/deployment=pd")
        names = [(c["kind"], c["metadata"]["name"]) for c in children["items"]]
        assert len(names) == len(set(names))
        assert sum(1 for k, _ in names if k == "StatefulSet") == 2
        # The admin token is created once and never rotated by a restart.
        assert get_json(cluster, namespace, "secret", "pd-admin")["data"]["token"] == token
        assert "Traceback" not in second.log()
    finally:
        second.stop()


def test_two_operators_only_one_acts_and_the_standby_takes_over(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> None:
    ns = namespace
    peering(cluster, ns)
    ha = ("--peering=pdwarden", "--peering-lifetime=15")
    active = OperatorProcess(cluster, [ns], tmp_path / "a.log", *ha, "--priority=200").start()
    standby = OperatorProcess(cluster, [ns], tmp_path / "b.log", *ha, "--priority=100")
    try:
        apply(cluster, ns, cpu_example())
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
        standby.start()
        # A peered replica starts paused (kopf pre-activates the pause) and stays so while a
        # higher-priority peer lives. Before anything is asserted about it, it has provably joined:
        # its heartbeat is in the peering object beside the active one's.
        cluster.wait_until("the standby's metrics endpoint", lambda: _answers(standby), 60)
        joined = cluster.wait_until(
            "the standby's heartbeat in the peering object", lambda: _heartbeat(cluster, ns, 100)
        )
        assert _heartbeat(cluster, ns, 200)
        baseline = standby.metric("pdwarden_reconciles_total")
        before = active.metric("pdwarden_reconciles_total")
        env = {"spec": {"decode": {"env": [{"name": "HA_PROBE", "value": "1"}]}}}
        cluster.kubectl("patch", "-n", ns, "pdd/pd", "--type=merge", "-p", json.dumps(env))
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, timeout=120)
        assert status(cluster, ns)["observedGeneration"] == 2
        assert active.metric("pdwarden_reconciles_total") > before
        # Two more remediation cycles of the active replica with the change in place (reconcile
        # passes come only when a child changes now), and a fresh heartbeat of the standby since
        # it joined: alive and peered all along, it made no pass.
        active.wait_cycles(2)
        cluster.wait_until(
            "a newer heartbeat of the standby",
            lambda: (_heartbeat(cluster, ns, 100) or "") > joined,
            30,
        )
        assert standby.metric("pdwarden_reconciles_total") == baseline

        active.kill(9)
        cluster.kubectl("scale", "-n", ns, "pdd/pd", "--replicas=1")
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "1/1", "router": "1/1"}, timeout=120)
        assert standby.metric("pdwarden_reconciles_total") > baseline
    finally:
        active.stop()
        standby.stop()


def _heartbeat(cluster: Cluster, ns: str, priority: int) -> str | None:
    """The last-seen time the replica of this priority wrote into the KopfPeering's status."""
    peering = get_json(cluster, ns, "kopfpeering", "pdwarden") or {}
    for peer in (peering.get("status") or {}).values():
        if isinstance(peer, dict) and peer.get("priority") == priority:
            return str(peer.get("lastseen") or "") or None
    return None


def _answers(op: OperatorProcess) -> bool:
    try:
        op.metric("pdwarden_reconciles_total")
    except OSError:
        return False
    return True
