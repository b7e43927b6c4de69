"""PDRemediationPolicy end to end over pods owned by LeaderWorkerSet's real controller.

LWS v0.9.0's own controller manager (built from its Go module, e2e/lws.py says how it is wired:
CRDs, its pod and LWS webhooks on 127.0.0.1 with a CA made at test time, the cluster's admin
kubeconfig) owns the pool: a prefill LeaderWorkerSet (1 group of 1) and a decode LeaderWorkerSet
(2 groups of 2). Each group's leader runs pdworker (decode with the decode-stall fault switch);
decode workers are idle processes standing in for a multi-node engine's other ranks, which serve
no HTTP. The labels the policy selects by (`leaderworkerset.sigs.k8s.io/name`, `worker-index`)
are set by LWS's pod webhook, so the policy finding its pods at all proves the webhook ran. A
router and a Service select decode leaders by a selector that includes the cordon label, as in
manifests/examples/policy-lws.yaml.

Scenarios (in file order; each also runs alone): DryRun reports a stalled decode leader (ledger,
Event, status) and changes nothing; Enforce cordons it by label and evicts it, and LWS (restart
policy RecreateGroupOnPodRestart, its default) recreates the whole group: leader and worker come
back with new uids and Ready, serving, and the wedge clears; a leader cordoned with no cause is
uncordoned after a healthy window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess
from e2e.lws import LABEL_GROUP_INDEX, LABEL_LWS_NAME, LABEL_WORKER_INDEX, LwsController
from e2e.pdtools import get_json, pod_condition
from e2e.policy_pool import (
    WEDGE_AFTER,
    Pool,
    dry_run_only_reports,
    foreign_pool,
    hand_cordoned_pod_is_uncordoned,
    open_namespace,
    start_pool,
)

from pdwarden.constants import LABEL_SERVING, WORKER_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "lws"
# Idle stand-in for an engine rank that serves no HTTP (the kubelet runs "python" images from
# the venv); it exits on SIGTERM like any process without a handler.
IDLE = ["python", "-c", "import signal; signal.pause()"]


def lws_objects(ns: str) -> list[dict[str, Any]]:
    """foreign_pool's objects with each StatefulSet turned into a LeaderWorkerSet of the same
    name and pod template (its leader template), and without the headless Services: LWS
    creates its own, named after the LeaderWorkerSet."""
    out = []
    for obj in foreign_pool(ns, APP):
        if obj["kind"] == "Service" and obj["spec"].get("clusterIP") == "None":
            continue
        if obj["kind"] != "StatefulSet":
            out.append(obj)
            continue
        template = obj["spec"]["template"]
        role = template["metadata"]["labels"]["role"]
        group: dict[str, Any] = {"size": 1, "workerTemplate": template}
        if role == "decode":
            worker = {
                "metadata": {"labels": {"app": APP, "role": "decode-worker"}},
                "spec": {"automountServiceAccountToken": False, "containers": [
                    {"name": "rank", "image": "python:3.11", "command": IDLE}]},
            }  # fmt: skip
            group = {"size": 2, "leaderTemplate": template, "workerTemplate": worker}
        out.append({
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": obj["metadata"]["name"], "labels": obj["metadata"]["labels"]},
            "spec": {"replicas": obj["spec"]["replicas"], "leaderWorkerTemplate": group},
        })  # fmt: skip
    return out


def leaders(lws: str) -> dict[str, Any]:
    """The policy's selector for one LeaderWorkerSet's group leaders, on LWS's own labels."""
    return {"matchLabels": {LABEL_LWS_NAME: lws, LABEL_WORKER_INDEX: "0"}}


@pytest.fixture(scope="module")
def lws_controller(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if cluster.local is None:
        pytest.skip("LWS's webhooks are served on this machine's 127.0.0.1: local cluster only")
    ctl = LwsController(cluster, tmp_path_factory.mktemp("lws")).start()
    try:
        yield ctl
    finally:
        ctl.stop()


@pytest.fixture(scope="module")
def pool(
    cluster: Cluster, crd: str, lws_controller: LwsController, tmp_path_factory: Any
) -> Iterator[Pool]:
    ns = open_namespace(cluster)
    token = start_pool(cluster, ns, APP, objects=lws_objects(ns))
    log: Path = tmp_path_factory.mktemp("policy-lws-operator") / "operator.log"
    op = OperatorProcess(cluster, [ns], log).start()
    p = Pool(cluster, ns, token, op, app=APP)
    p.counts = {"prefill": 1, "decode": 2, "decode-worker": 2, "router": 1}
    p.selectors = {
        "prefillSelector": leaders(f"{APP}-prefill"),
        "decodeSelector": leaders(f"{APP}-decode"),
    }
    try:
        p.wait_ready(timeout=240)
        yield p
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def group_of(pool: Pool, leader: dict[str, Any]) -> dict[str, str]:
    """name -> uid of the leader's whole group (leader and workers), by LWS's group-index."""
    index = leader["metadata"]["labels"][LABEL_GROUP_INDEX]
    sel = f"{LABEL_LWS_NAME}={APP}-decode,{LABEL_GROUP_INDEX}={index}"
    items = (get_json(pool.cluster, pool.ns, "pods", "-l", sel) or {}).get("items") or []
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in items}


def victim_of(pool: Pool) -> dict[str, Any]:
    return pool.pods("decode")[1]


def test_lws_labels_its_pods_and_the_policy_selects_the_leaders(pool: Pool) -> None:
    pool.apply_policy(mode="DryRun")
    for pod in pool.pods("decode") + pool.pods("decode-worker"):
        labels = pod["metadata"]["labels"]
        assert labels[LABEL_LWS_NAME] == f"{APP}-decode"  # set by LWS's pod webhook
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "StatefulSet"  # LWS's leader or worker StatefulSet
    assert len(group_of(pool, victim_of(pool))) == 2

    def matched() -> Any:
        st = pool.status()
        return (st.get("prefill") or {}).get("matched") == 1 and (st.get("decode") or {}).get(
            "matched"
        ) == 2

    pool.cluster.wait_until("the policy matching the LWS leaders", matched, 30)


def test_dry_run_reports_and_does_nothing(pool: Pool) -> None:
    pool.apply_policy(mode="DryRun")
    victim = victim_of(pool)
    before = group_of(pool, victim)
    pool.stall(victim)
    pool.load_onto(victim)
    dry_run_only_reports(pool)
    assert group_of(pool, victim) == before
    assert pool.pod(victim["metadata"]["name"])["metadata"]["labels"][LABEL_SERVING] == "true"


def test_enforce_evicts_the_stalled_leader_and_lws_recreates_its_group(pool: Pool) -> None:
    victim = victim_of(pool)
    name = victim["metadata"]["name"]
    before = group_of(pool, victim)
    pool.stall(victim)  # idempotent: still stalled if the DryRun scenario ran first
    pool.apply_policy(mode="Enforce")
    pool.load_onto(victim)

    def recreated() -> Any:
        now = group_of(pool, victim)
        fresh = [n for n, uid in now.items() if uid not in before.values()]
        pods = [pool.pod(n) for n in fresh]
        ready = [p for p in pods if pod_condition(p, "Ready").get("status") == "True"]
        return len(now) == 2 and len(ready) == 2 and now

    after = pool.cluster.wait_until("LWS recreating the whole group Ready", recreated, 150)
    assert set(after) == set(before)  # same names, every pod new
    assert pool.pod(name)["metadata"]["labels"][LABEL_SERVING] == "true"  # from the template
    enforced = [e for e in pool.ledger() if not e["dryRun"] and e["pod"] == name]
    assert [e["action"] for e in enforced][:2] == ["CordonDecode", "RestartDecode"]
    assert all(e["outcome"] == "Succeeded" for e in enforced[:2])
    assert pool.events("CordonDecode") and pool.events("RestartDecode")

    def wedge_cleared() -> bool:
        st = pool.status()
        cond = next((c for c in st.get("conditions") or [] if c["type"] == "Wedged"), {})
        return cond.get("status") == "False"

    pool.cluster.wait_until("the Wedged condition cleared", wedge_cleared, WEDGE_AFTER + 30)
    pool.wait_ready()
    ips = {p["status"]["podIP"] for p in pool.pods("decode")}
    served = {pool.generate(f"after the restart {i}").get("decode") for i in range(6)}
    assert served <= {f"http://{ip}:{WORKER_PORT}" for ip in ips} and None not in served


def test_a_cordoned_leader_is_uncordoned_after_a_healthy_window(pool: Pool) -> None:
    hand_cordoned_pod_is_uncordoned(pool)
