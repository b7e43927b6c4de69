"""Status comes from what the workloads and pods report, and changes only when they do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.api import PDDeploymentStatus, parse_spec
from pdwarden.reconciling.observe import Observed, compute_status, pod_problems

SPEC = parse_spec(
    {
        "model": {"name": "tiny"},
        "prefill": {"replicas": 1, "gpus": 0},
        "decode": {"replicas": 2, "gpus": 0},
        "router": {"replicas": 1},
    }
)
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def sts(role: str, ready: int, updated: int, replicas: int, revisions: tuple[str, str]) -> Any:
    return {
        "kind": "StatefulSet",
        "metadata": {"name": f"d-{role}", "generation": 3},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "currentRevision": revisions[0],
            "updateRevision": revisions[1],
        },
    }


def router(ready: int) -> Any:
    return {
        "kind": "Deployment",
        "metadata": {"name": "d-router", "generation": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": ready,
                   "updatedReplicas": 1},
    }  # fmt: skip


def settled() -> Observed:
    return Observed(
        workloads={
            "prefill": sts("prefill", 1, 1, 1, ("a", "a")),
            "decode": sts("decode", 2, 2, 2, ("b", "b")),
            "router": router(1),
        }
    )


def cond(status: PDDeploymentStatus, type_: str) -> Any:
    return next(c for c in status.conditions if c.type == type_)


def run(observed: Observed, previous: PDDeploymentStatus | None = None, now: datetime = T0) -> Any:
    return compute_status(
        SPEC,
        observed,
        previous or PDDeploymentStatus(),
        generation=7,
        now=now,
        selectors={"decode": "x=y"},
    )


def test_all_roles_settled_is_ready() -> None:
    s = run(settled())
    assert s.phase == "Ready"
    assert cond(s, "Ready").status == "True"
    assert cond(s, "Progressing").status == "False"
    assert cond(s, "Degraded").status == "False"
    assert (s.decode.ready_replicas, s.decode.replicas, s.decode.summary) == (2, 2, "2/2")
    assert s.observed_generation == 7
    assert s.decode.selector == "x=y"


def test_a_rollout_in_flight_is_progressing_not_ready() -> None:
    obs = settled()
    obs.workloads["decode"] = sts("decode", 2, 1, 2, ("b", "c"))
    s = run(obs)
    assert s.phase == "Progressing"
    assert cond(s, "Progressing").status == "True"
    assert "decode 2/2 ready, 1 updated" in cond(s, "Progressing").message
    assert cond(s, "Ready").status == "False"


def test_missing_workload_counts_as_zero_ready() -> None:
    obs = settled()
    obs.workloads.pop("prefill")
    s = run(obs)
    assert s.prefill.ready_replicas == 0
    assert s.phase == "Progressing"


def test_crash_looping_pod_is_degraded_with_pod_and_reason() -> None:
    obs = settled()
    obs.pods = [
        {
            "metadata": {"name": "d-decode-1"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 2}},
                    }
                ],
            },
        }
    ]
    s = run(obs)
    assert s.phase == "Degraded"
    assert cond(s, "Degraded").message == "pod d-decode-1: CrashLoopBackOff (last exit code 2)"


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = run(settled())
    later = run(settled(), previous=first, now=T0 + timedelta(minutes=5))
    assert later == first  # nothing material changed: no status write
    obs = settled()
    obs.workloads["decode"] = sts("decode", 1, 2, 2, ("b", "b"))
    flipped = run(obs, previous=first, now=T0 + timedelta(minutes=6))
    assert cond(flipped, "Ready").last_transition_time == T0 + timedelta(minutes=6)


def test_pod_problems_ignores_healthy_and_starting_pods() -> None:
    pods = [
        {"metadata": {"name": "ok"}, "status": {"containerStatuses": [{"state": {"running": {}}}]}},
        {
            "metadata": {"name": "pulling"},
            "status": {
                "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]
            },
        },
    ]
    assert pod_problems(pods) == []
