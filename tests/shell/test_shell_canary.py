"""The confirm stage in whole PDDeployment cycles (engine vllm): the real shell over fakes.

A vLLM decode frozen behind its live API server looks idle on its own /metrics; only the
prefill's expired leases (LeaseExpired) name it, as a suspect. `LeaseWorkers` serves those
metrics, `CanaryFake` says what a canary on each decode finds. Each test asserts what a user
sees: the ledger, the pod's serving condition, the WedgeDetected Event, the canary counter.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY
from shell_fakes import CanaryFake, KubeFake, LeaseWorkers, cluster

from pdwarden.constants import CONDITION_SERVING, KIND, WORKER_PORT
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle

KEY = b"k" * 32


def canaries(verdict: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_canaries_total", {"verdict": verdict}) or 0.0


def errors(stage: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_operator_errors_total", {"stage": stage}) or 0.0


def vllm_cluster(kube: KubeFake, decode: int = 1, engine: str = "vllm") -> str:
    """`cluster` with engine vllm, one prefill whose leases expire; returns the object's uid."""
    cluster(kube, prefill=1, decode=decode)
    obj = kube.objects[(KIND, "ns", "pd")]
    obj["spec"]["engine"] = engine
    return str(obj["metadata"]["uid"])


@pytest.fixture
def kube() -> KubeFake:
    return KubeFake()


@pytest.fixture
def workers() -> LeaseWorkers:
    return LeaseWorkers(expiring={"pd-prefill-0"})


def cycle(state: OperatorState, kube: KubeFake) -> None:
    asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def history(kube: KubeFake) -> list[dict[str, Any]]:
    status = kube.obj(KIND, "ns", "pd").get("status") or {}
    return list((status.get("remediation") or {}).get("history") or [])


def serving(kube: KubeFake, name: str) -> dict[str, Any]:
    conditions = kube.obj("Pod", "ns", name)["status"]["conditions"]
    return dict(next(c for c in conditions if c["type"] == CONDITION_SERVING))


def test_a_lease_suspect_whose_canary_is_dead_is_cordoned_though_it_is_the_last_decode(
    kube: KubeFake, workers: LeaseWorkers
) -> None:
    uid = vllm_cluster(kube)
    canary = CanaryFake(verdicts={"pd-decode-0": "dead"})
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          canary=canary)  # fmt: skip
    dead = canaries("dead")
    cycle(state, kube)  # one sample each: no lease has expired in a window yet
    assert history(kube) == [] and canary.asked == []
    cycle(state, kube)
    assert canary.asked == [("pd-decode-0", f"http://127.0.2.1:{WORKER_PORT}", uid)]
    [entry] = history(kube)
    assert (entry["action"], entry["pod"], entry["outcome"]) == (
        "CordonDecode", "pd-decode-0", "Succeeded",
    )  # fmt: skip
    assert "canary: no token within 30s" in entry["reason"]
    assert serving(kube, "pd-decode-0")["status"] == "False"
    assert canaries("dead") - dead == 1
    wedge = next(e for e in kube.events if e["reason"] == "WedgeDetected")
    assert wedge["message"].startswith("LeaseExpired on pd-prefill-0: ")
    assert "canary: pd-decode-0 dead (no token within 30s" in wedge["message"]


def test_still_dead_after_restart_after_seconds_the_cordoned_decode_is_restarted(
    kube: KubeFake, workers: LeaseWorkers
) -> None:
    vllm_cluster(kube)
    canary = CanaryFake(verdicts={"pd-decode-0": "dead"})
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          canary=canary)  # fmt: skip
    before = REGISTRY.get_sample_value("pdwarden_canary_requests_total", {"kind": "token"}) or 0
    cycle(state, kube)
    cycle(state, kube)
    assert [e["action"] for e in history(kube)] == ["CordonDecode"]
    # Its cost: a model list and a completion per canary, in the metrics and the ledger.
    tally = kube.obj(KIND, "ns", "pd")["status"]["remediation"]["canaries"]
    assert tally["sent"] >= 1 and tally["requests"] >= 2
    after = REGISTRY.get_sample_value("pdwarden_canary_requests_total", {"kind": "token"})
    assert after == before + 2 * len(canary.asked)
    # restartAfterSeconds (10) have passed since the cordon; the leases stop expiring, so the
    # canary runs only because the pod is cordoned by us.
    kube.objects[("Pod", "ns", "pd-decode-0")]["status"]["conditions"][-1][
        "lastTransitionTime"] = "2020-01-01T00:00:00Z"  # fmt: skip
    workers.expiring.clear()
    cycle(state, kube)
    assert [p for p, _, _ in canary.asked] == ["pd-decode-0", "pd-decode-0"]
    assert [e["action"] for e in history(kube)] == ["CordonDecode", "RestartDecode"]
    assert "still dead, canary: no token within 30s" in history(kube)[-1]["reason"]
    assert ("Pod", "ns", "pd-decode-0") not in kube.objects  # its StatefulSet recreates it


def test_an_alive_suspect_is_left_alone_and_the_finding_says_why(
    kube: KubeFake, workers: LeaseWorkers
) -> None:
    vllm_cluster(kube, decode=2)
    canary = CanaryFake()  # every decode answers
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          canary=canary)  # fmt: skip
    cycle(state, kube)
    cycle(state, kube)
    assert sorted(p for p, _, _ in canary.asked) == ["pd-decode-0", "pd-decode-1"]
    assert history(kube) == []
    assert serving(kube, "pd-decode-0")["status"] == "True"
    wedge = next(e for e in kube.events if e["reason"] == "WedgeDetected")
    assert "canary: pd-decode-0 alive (a token in 0.1s); pd-decode-1 alive" in wedge["message"]


def test_a_canary_that_raises_is_contained_and_proves_nothing(
    kube: KubeFake, workers: LeaseWorkers
) -> None:
    vllm_cluster(kube)
    canary = CanaryFake(raises={"pd-decode-0": RuntimeError("boom")})
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          canary=canary)  # fmt: skip
    before, unknown, failed = errors("canary"), canaries("unknown"), errors("cycle")
    cycle(state, kube)
    cycle(state, kube)
    assert canary.asked and history(kube) == []
    assert errors("canary") - before == 1 and canaries("unknown") - unknown == 1
    assert errors("cycle") == failed  # the cycle itself went on and wrote its status
    wedged = next(c for c in kube.obj(KIND, "ns", "pd")["status"]["conditions"]
                  if c["type"] == "Wedged")  # fmt: skip
    assert "canary: pd-decode-0 unknown (canary failed: RuntimeError: boom)" in wedged["message"]


def test_other_engines_never_run_a_canary(kube: KubeFake, workers: LeaseWorkers) -> None:
    vllm_cluster(kube, engine="pdworker")
    canary = CanaryFake(verdicts={"pd-decode-0": "dead"})
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          canary=canary)  # fmt: skip
    cycle(state, kube)
    cycle(state, kube)
    assert canary.asked == [] and history(kube) == []
