"""PDRemediationPolicy end to end: pods pdwarden did not create, owned by a real StatefulSet.

The PD pool is what a user would run without pdwarden: a plain StatefulSet of pdworker prefill
pods, one of pdworker decode pods (with the decode-stall fault switch standing in for a wedged
engine), a router Deployment that discovers decode pods by a label selector that includes the
cordon label, and a Service in front of the decode pods selecting it too. pdwarden only watches
them through one PDRemediationPolicy. One namespace, one operator and one pool are shared by the
scenarios (in file order; each also runs alone): DryRun reports and changes nothing; Enforce
cordons by label (the Service's endpoints and the router's view drop the pod) and evicts the
stalled decode, which the StatefulSet recreates; a PodDisruptionBudget that forbids the eviction
is honoured (held back, reason in status); a pod cordoned with no cause is uncordoned after a
healthy window; a second policy over the same pods is refused by both; and, on a second pool
whose workers race status against abort, Enforce fails exactly the wedged rooms.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess
from e2e.pdtools import apply, get_json, http, scrape
from e2e.policy_pool import (
    APP,
    RESTART_AFTER,
    WEDGE_AFTER,
    Pool,
    dry_run_only_reports,
    hand_cordoned_pod_is_uncordoned,
    open_namespace,
    policy_doc,
    start_pool,
)

from pdwarden.constants import LABEL_SERVING, WORKER_PORT
from pdworker import contract as pdw

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def pool(cluster: Cluster, crd: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    ns = open_namespace(cluster)
    token = start_pool(cluster, ns, "sgl")
    log = tmp_path_factory.mktemp("policy-operator") / "operator.log"
    op = OperatorProcess(cluster, [ns], log).start()
    p = Pool(cluster, ns, token, op)
    try:
        p.wait_ready()
        yield p
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def victim_of(pool: Pool) -> dict[str, Any]:
    return pool.pods("decode")[1]


def test_dry_run_reports_and_does_nothing(pool: Pool) -> None:
    pool.apply_policy(mode="DryRun")
    victim = victim_of(pool)
    pool.stall(victim)
    pool.load_onto(victim)
    st = dry_run_only_reports(pool)
    now = pool.pod(victim["metadata"]["name"])
    assert now["metadata"]["uid"] == victim["metadata"]["uid"]
    assert now["metadata"]["labels"][LABEL_SERVING] == "true"
    assert st["prefill"]["matched"] == 1 and st["decode"]["matched"] == 2


def test_enforce_cordons_by_label_and_evicts_the_stalled_decode(pool: Pool) -> None:
    victim = victim_of(pool)
    name = victim["metadata"]["name"]
    pool.stall(victim)  # idempotent: still stalled if the DryRun scenario ran first
    pool.apply_policy(mode="Enforce", restartAfterSeconds=600)  # cordon first, restart later
    pool.load_onto(victim)

    def cordoned() -> bool:
        return pool.pod(name)["metadata"]["labels"].get(LABEL_SERVING) == "false"

    pool.cluster.wait_until("the stalled pod cordoned by label", cordoned, WEDGE_AFTER + 30)

    def out_of_service() -> bool:
        # The pods the Service's own selector picks, as the EndpointSlice controller would (this
        # cluster's pod IPs are in 127/8, which the API server refuses in EndpointSlices).
        svc = get_json(pool.cluster, pool.ns, "service", "sgl-serving")
        sel = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
        picked = {
            p["metadata"]["name"]
            for p in get_json(pool.cluster, pool.ns, "pods", "-l", sel)["items"]
        }
        return bool(picked) and name not in picked

    pool.cluster.wait_until("the Service no longer selecting the pod", out_of_service, 30)
    healthy = pool.pods("decode")[0]["status"]["podIP"]
    for i in range(6):  # the router's view dropped it too (its selector includes the label)
        answer = pool.generate(f"while cordoned {i}")
        assert answer.get("ok") is True, answer
        assert answer["decode"] == f"http://{healthy}:{WORKER_PORT}"
    pool.apply_policy(mode="Enforce")  # restartAfterSeconds back to RESTART_AFTER

    def replaced() -> Any:
        pod = pool.pod(name)
        return pod and pod["metadata"]["uid"] != victim["metadata"]["uid"] and pod

    new = pool.cluster.wait_until("the StatefulSet to recreate the evicted pod", replaced, 90)
    assert new["metadata"]["labels"][LABEL_SERVING] == "true"  # from the template
    restarts = [e for e in pool.ledger() if e["action"] == "RestartDecode" and not e["dryRun"]]
    assert restarts and restarts[-1]["outcome"] == "Succeeded"
    assert pool.events("CordonDecode") and pool.events("RestartDecode")
    pool.wait_ready()


def test_a_pdb_that_forbids_the_eviction_is_honoured(pool: Pool) -> None:
    pool.wait_ready()
    apply(pool.cluster, pool.ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "sgl-decode"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {**APP, "role": "decode"}}},
    })  # fmt: skip
    pool.apply_policy(mode="Enforce")
    victim = victim_of(pool)
    name = victim["metadata"]["name"]
    pool.stall(victim)
    pool.load_onto(victim)

    def held() -> Any:
        return [h for h in pool.status().get("heldBack") or [] if h["pod"] == name]

    (note,) = pool.cluster.wait_until(
        "the eviction held back", held, WEDGE_AFTER + RESTART_AFTER + 40
    )
    assert note["action"] == "RestartDecode" and "disruption budget" in note["reason"].lower()
    assert pool.pod(name)["metadata"]["uid"] == victim["metadata"]["uid"]
    skipped = [e for e in pool.ledger() if e["action"] == "RestartDecode" and e["pod"] == name]
    assert skipped and skipped[-1]["outcome"] == "Skipped"
    print(pool.get_pdrp())
    view = subprocess.run(  # `pdwarden status` finds the policy by name and shows the hold
        [str(Path(sys.executable).parent / "pdwarden"), "status", "sgl", "-n", pool.ns],
        capture_output=True, text=True, timeout=60, check=False, env=pool.cluster.env,
    )  # fmt: skip
    print(view.stdout)
    assert view.returncode == 0, view.stderr
    assert view.stdout.startswith(f"PDRemediationPolicy {pool.ns}/sgl")
    assert "Held back:" in view.stdout and name in view.stdout
    pool.cluster.kubectl("delete", "pdb", "sgl-decode", "-n", pool.ns)

    def replaced() -> bool:
        return pool.pod(name).get("metadata", {}).get("uid") not in (
            None,
            victim["metadata"]["uid"],
        )

    pool.cluster.wait_until("the eviction once the PDB is gone", replaced, 60)
    pool.cluster.wait_until("heldBack cleared", lambda: not held(), 30)
    pool.wait_ready()


def test_a_cordoned_pod_is_uncordoned_after_a_healthy_window(pool: Pool) -> None:
    hand_cordoned_pod_is_uncordoned(pool)


def test_two_policies_over_one_pod_are_both_refused(pool: Pool) -> None:
    pool.apply_policy(mode="Enforce")
    other = policy_doc("other")
    other["spec"]["decodeSelector"] = {"matchLabels": {"role": "none"}}
    apply(pool.cluster, pool.ns, other)

    def conflict(name: str) -> bool:
        cond = [c for c in pool.status(name).get("conditions") or [] if c["type"] == "Conflict"]
        return bool(cond) and cond[0]["status"] == "True"

    pool.cluster.wait_until("Conflict on both", lambda: conflict("sgl") and conflict("other"), 30)
    refused = pool.status("sgl")["refused"]
    assert [r["reason"] for r in refused] == ["SelectedByAnotherPolicy"]
    assert refused[0]["policies"] == ["other"]
    print(pool.get_pdrp())
    pool.cluster.kubectl("delete", "pdrp", "other", "-n", pool.ns)
    pool.cluster.wait_until("no Conflict", lambda: not conflict("sgl"), 30)


def test_enforce_fails_exactly_the_wedged_rooms(pool: Pool) -> None:
    """A second pool whose workers race status against abort (legacy-status-race) until rooms
    stick in the prefill's inflight queue; its own policy fails them through pdworker's admin
    API with the token from spec.adminTokenSecretRef."""
    race_faults = {"env": [{"name": "PDWORKER_FAULTS",
                            "value": "legacy-status-race,no-inflight-watchdog"}],
                   "args": ["--prefill-chunk-ms", "3", "--chunk-pages", "1"]}  # fmt: skip
    token = start_pool(pool.cluster, pool.ns, "race", prefill=race_faults, decode=race_faults)
    race = Pool(pool.cluster, pool.ns, token, pool.operator, app="race")
    race.wait_ready()
    apply(pool.cluster, pool.ns, policy_doc("race", "race", mode="Enforce"))
    prefill_url = f"http://{race.pods('prefill')[0]['status']['podIP']}:{WORKER_PORT}"
    stuck: list[dict[str, Any]] = []
    for _ in range(4):  # storms until the race leaves rooms stuck in the inflight queue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [str(Path(sys.executable).parent / "pdworker"), "load", "--url", race.router(),
                 "--json", str(Path(tmp) / "s.json"), "--clients", "30", "--requests", "600",
                 "--cancel-fraction", "0.3", "--cancel-max-ms", "150", "--prompt-len", "4:64",
                 "--output-len", "1:8"],
                capture_output=True, timeout=120, check=False,
            )  # fmt: skip
        code, rooms = http("GET", prefill_url + "/admin/rooms", token=token)
        assert code == 200
        stuck = [r for r in rooms if r["phase"] == "inflight"]
        if stuck or any(e["action"] == "FailRooms" for e in race.ledger("race")):
            break
    assert stuck or race.ledger("race"), "the legacy-status-race fault did not wedge any room"

    def drained() -> bool:
        m = scrape(prefill_url + "/metrics")
        return m.get(pdw.PREFILL_INFLIGHT_QUEUE) == 0

    pool.cluster.wait_until("the race prefill's inflight queue drained", drained, WEDGE_AFTER + 30)
    failed = [e for e in race.ledger("race") if e["action"] == "FailRooms"]
    assert failed and all(e["outcome"] == "Succeeded" and not e["dryRun"] for e in failed)
    assert sum(e["rooms"] for e in failed) >= 1
    admin_failed = scrape(prefill_url + "/metrics").get(
        f'{pdw.REQUESTS_FAILED}{{reason="admin"}}', 0
    )
    assert admin_failed == sum(e["rooms"] for e in failed)
    assert race.events("FailRooms")
