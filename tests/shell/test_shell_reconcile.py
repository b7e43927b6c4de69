"""Whole reconcile passes in-process: the real shell (handlers + reconcile) over `KubeFake`.

What a user would see after a pass: the children it created (owned by the PDDeployment), the
status it wrote, the pods it marked serving, and what it refused; plus how failures of the API
server turn into kopf retries that are counted, never into a dead handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY
from shell_fakes import KubeFake, WorkerFake, pddeployment, pod

from pdwarden.constants import CONDITION_SERVING, KIND
from pdwarden.handlers.on_deployment import OperatorState, reconcile_now
from pdwarden.k8s import ApiError
from pdwarden.reconciling.reconcile import PassResult

KEY = b"k" * 32


def reconciles(result: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_reconciles_total", {"result": result}) or 0.0


def errors(stage: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_operator_errors_total", {"stage": stage}) or 0.0


def run_pass(state: OperatorState, kube: KubeFake, force: bool = False) -> PassResult:
    return asyncio.run(reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=force))


def condition(kube: KubeFake, type_: str) -> dict[str, Any]:
    status = kube.obj(KIND, "ns", "pd")["status"]
    return next(c for c in status["conditions"] if c["type"] == type_)


@pytest.fixture
def kube() -> KubeFake:
    kube = KubeFake()
    pddeployment(kube)
    return kube


@pytest.fixture
def state(kube: KubeFake) -> OperatorState:
    return OperatorState(client=kube, workers=WorkerFake(), token_key=KEY)


def test_a_pass_creates_owned_children_and_a_second_pass_writes_nothing(
    kube: KubeFake, state: OperatorState
) -> None:
    first = run_pass(state, kube)
    uid = kube.obj(KIND, "ns", "pd")["metadata"]["uid"]
    children = [o for (k, _, _), o in kube.objects.items() if k != KIND]
    assert {o["kind"] for o in children} >= {"StatefulSet", "Service", "Secret"}
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in children)
    assert "StatefulSet/pd-decode" in first.applied
    status = kube.obj(KIND, "ns", "pd")["status"]
    assert status["observedGeneration"] == 1 and status["phase"] == "Progressing"
    before = {key: o["metadata"]["resourceVersion"] for key, o in kube.objects.items()}
    second = run_pass(state, kube)
    assert second.applied == []
    assert {key: o["metadata"]["resourceVersion"] for key, o in kube.objects.items()} == before


def test_new_decode_pods_start_serving_but_lookalikes_and_cordons_are_left_alone(
    kube: KubeFake, state: OperatorState
) -> None:
    run_pass(state, kube)
    sts = kube.obj("StatefulSet", "ns", "pd-decode")
    pod(kube, sts, "pd-decode-0", "decode", "127.0.2.1")
    cordoned = pod(kube, sts, "pd-decode-1", "decode", "127.0.2.2")
    cordoned["status"]["conditions"].append({"type": CONDITION_SERVING, "status": "False"})
    kube.put(cordoned)
    pod(kube, None, "pd-decode-evil", "decode", "127.0.9.1")
    run_pass(state, kube)

    def serving(name: str) -> list[str]:
        conditions = kube.obj("Pod", "ns", name)["status"]["conditions"]
        return [c["status"] for c in conditions if c["type"] == CONDITION_SERVING]

    assert serving("pd-decode-0") == ["True"]
    assert serving("pd-decode-1") == ["False"]
    assert serving("pd-decode-evil") == []


def test_a_name_taken_by_a_foreign_object_is_reported_not_taken_over(
    kube: KubeFake, state: OperatorState
) -> None:
    foreign = kube.put(
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "pd-prefill", "namespace": "ns"}, "spec": {"ports": []}}
    )  # fmt: skip
    run_pass(state, kube)
    assert kube.obj("Service", "ns", "pd-prefill") == foreign
    degraded = condition(kube, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ApplyFailed"
    assert "ConflictingObject" in degraded["message"]
    assert any(e["reason"] == "ApplyFailed" for e in kube.events)


@pytest.mark.parametrize(
    ("fault", "stage"),
    [
        (ApiError(0, "GET /apis/apps/v1/statefulsets: MaxRetryError: refused"), None),
        (ApiError(503, "the server is currently unable to handle the request"), None),
        (RecursionError("maximum recursion depth exceeded"), "reconcile"),
    ],
    ids=["unreachable", "unavailable", "bug"],
)
def test_failures_become_kopf_retries_and_are_counted(
    kube: KubeFake, state: OperatorState, fault: BaseException, stage: str | None
) -> None:
    errors_before, stage_before = reconciles("error"), errors(stage or "reconcile")
    kube.fail["list"].append(fault)
    with pytest.raises(kopf.TemporaryError):
        run_pass(state, kube)
    assert reconciles("error") == errors_before + 1
    assert errors(stage or "reconcile") == stage_before + (1 if stage else 0)
    run_pass(state, kube)  # the retry converges
    assert condition(kube, "Progressing")["status"] == "True"


def test_a_conflicting_status_write_is_merged_and_written(
    kube: KubeFake, state: OperatorState
) -> None:
    kube.fail["patch_status"].append(ApiError(409, "the object has been modified"))
    run_pass(state, kube)
    assert kube.obj(KIND, "ns", "pd")["status"]["observedGeneration"] == 1


def test_an_invalid_spec_is_reported_once(kube: KubeFake, state: OperatorState) -> None:
    obj = kube.obj(KIND, "ns", "pd")
    obj["spec"]["remediation"]["wedgeAfterSeconds"] = 1  # below the minimum
    kube.put(obj)
    result = run_pass(state, kube)
    assert result.invalid
    status = kube.obj(KIND, "ns", "pd")["status"]
    assert status["phase"] == "Failed"
    assert "wedgeAfterSeconds" in condition(kube, "Degraded")["message"]
    run_pass(state, kube)
    assert [e["reason"] for e in kube.events].count("InvalidSpec") == 1


def test_a_hand_edited_status_keeps_every_valid_ledger_entry(
    kube: KubeFake, state: OperatorState
) -> None:
    good = {"time": "2026-01-01T00:00:00Z", "action": "FailRooms", "pod": "pd-prefill-0"}
    bad = {"time": "2026-01-01T00:00:01Z", "action": "FailRooms", "pod": "x" * 254}
    kube.objects[(KIND, "ns", "pd")]["status"] = {
        "phase": "NotAPhase", "remediation": {"history": [good, bad], "actionsLastHour": -1}
    }  # fmt: skip
    run_pass(state, kube)
    history = kube.obj(KIND, "ns", "pd")["status"]["remediation"]["history"]
    assert [e["pod"] for e in history] == ["pd-prefill-0"]
