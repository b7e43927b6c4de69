"""reconciling.plan: what a pass applies, which pods it marks serving, an invalid spec's status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pdwarden.api import Condition, PDDeploymentStatus
from pdwarden.constants import ANNOTATION_TEMPLATE_HASH, CONDITION_SERVING, LABEL_ROLE
from pdwarden.reconciling.observe import Observed
from pdwarden.reconciling.plan import (
    apply_everything,
    apply_waves,
    invalid_status,
    pods_to_serve,
    to_apply,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def workload(role: str, hash_: str, replicas: int, kind: str = "StatefulSet") -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": f"pd-{role}", "labels": {LABEL_ROLE: role},
                     "annotations": {ANNOTATION_TEMPLATE_HASH: hash_}},
        "spec": {"replicas": replicas},
    }  # fmt: skip


SERVICE = {"kind": "Service", "metadata": {"name": "pd-decode", "labels": {}}}


def test_only_drifted_workloads_are_applied_on_a_quiet_pass() -> None:
    desired = [workload("prefill", "a", 1), workload("decode", "b", 2), SERVICE]
    observed = Observed(
        workloads={"prefill": workload("prefill", "a", 1), "decode": workload("decode", "b", 3)}
    )
    assert [o["metadata"]["name"] for o in to_apply(desired, observed, everything=False)] == [
        "pd-decode"
    ]
    assert len(to_apply(desired, observed, everything=True)) == 3
    assert [o["metadata"]["name"] for o in to_apply(desired, Observed(), everything=False)] == [
        "pd-prefill", "pd-decode",
    ]  # fmt: skip


def test_what_pods_use_is_applied_in_a_wave_before_the_workloads() -> None:
    account = {"kind": "ServiceAccount", "metadata": {"name": "pd-router"}}
    router = workload("router", "c", 1, kind="Deployment")
    desired = [workload("prefill", "a", 1), SERVICE, router, account, workload("decode", "b", 2)]
    waves = [[o["metadata"]["name"] for o in w] for w in apply_waves(desired)]
    assert waves == [["pd-decode", "pd-router"], ["pd-prefill", "pd-router", "pd-decode"]]
    assert [w[0]["kind"] for w in apply_waves(desired)] == ["Service", "StatefulSet"]
    assert apply_waves([SERVICE]) == [[SERVICE]] and apply_waves([]) == []


def degraded(reason: str) -> PDDeploymentStatus:
    c = Condition(type="Degraded", status="True", reason=reason, last_transition_time=NOW)
    return PDDeploymentStatus(observed_generation=3, conditions=[c])


def test_everything_is_reapplied_after_a_spec_change_or_while_an_apply_fails() -> None:
    assert apply_everything(PDDeploymentStatus(observed_generation=2), 3)
    assert not apply_everything(degraded("PodsFailing"), 3)
    assert apply_everything(degraded("ApplyFailed"), 3)
    assert apply_everything(degraded("ConflictingObject"), 3)


def test_new_decode_pods_are_marked_serving_but_cordoned_and_terminating_ones_are_not() -> None:
    def pod(name: str, role: str = "decode", serving: str | None = None, **meta: Any) -> Any:
        conditions = [{"type": CONDITION_SERVING, "status": serving}] if serving else []
        return {"metadata": {"name": name, "namespace": "ns", "labels": {LABEL_ROLE: role},
                             **meta}, "status": {"conditions": conditions}}  # fmt: skip

    deleting = pod("d-3", deletionTimestamp="2026-01-01T00:00:00Z")
    pods = [pod("d-0"), pod("d-1", serving="False"), pod("d-2", serving="True"), deleting,
            pod("p-0", "prefill")]  # fmt: skip
    assert pods_to_serve(pods) == [("ns", "d-0")]


def test_an_invalid_spec_is_failed_degraded_and_not_ready() -> None:
    st = invalid_status(PDDeploymentStatus(), "invalid spec: x", NOW, 4)
    assert st.phase == "Failed" and st.observed_generation == 4
    assert {(c.type, c.status, c.reason) for c in st.conditions} == {
        ("Degraded", "True", "InvalidSpec"), ("Ready", "False", "InvalidSpec"),
    }  # fmt: skip
