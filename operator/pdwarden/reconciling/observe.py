"""Status from observation: what the workloads and pods report, never what was intended.

Why pure: the operator's honesty about Ready/Progressing/Degraded is the part users rely on
most, so it is computed from plain observed objects and unit-tested on recorded shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pdwarden.api import (
    DecodeStatus,
    PDDeploymentSpec,
    PDDeploymentStatus,
    RoleStatus,
)
from pdwarden.conditions import phase_of, set_condition
from pdwarden.constants import CONDITION_SERVING, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL, ROLE_ROUTER

Obj = dict[str, Any]

# Container waiting reasons that mean "this pod will not come up on its own".
FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "ImageNotMapped",
    }
)


@dataclass
class Observed:
    """The PDDeployment's children as last listed from the API server."""

    workloads: dict[str, Obj | None] = field(default_factory=dict)  # role -> StatefulSet/Deploy
    pods: list[Obj] = field(default_factory=list)


def _role_counts(workload: Obj | None, desired: int) -> tuple[int, int, int, bool]:
    """(desired, ready, updated, settled) as the workload controller reports them."""
    if workload is None:
        return desired, 0, 0, desired == 0
    st = workload.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    updated = int(st.get("updatedReplicas") or 0)
    replicas = int(st.get("replicas") or 0)
    generation = (workload.get("metadata") or {}).get("generation")
    seen = st.get("observedGeneration") == generation
    revision_done = st.get("updateRevision", "") == st.get("currentRevision", "")
    if workload.get("kind") == "Deployment":
        revision_done = True
    settled = (
        seen and revision_done and ready == desired and updated == desired and replicas == desired
    )
    return desired, ready, updated, settled


def pod_problems(pods: list[Obj]) -> list[str]:
    """One line per pod that is failing to run, naming the pod and the reason."""
    problems = []
    for pod in pods:
        name = pod["metadata"]["name"]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason", "")
            if reason in FAILING_REASONS:
                last = (cs.get("lastState") or {}).get("terminated") or {}
                detail = waiting.get("message") or (
                    f"last exit code {last['exitCode']}" if "exitCode" in last else ""
                )
                problems.append(f"pod {name}: {reason}" + (f" ({detail})" if detail else ""))
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Failed":
            problems.append(f"pod {name}: Failed ({pod['status'].get('reason', 'exited')})")
    return sorted(problems)


def cordoned_pods(pods: list[Obj]) -> list[str]:
    """Decode pods whose serving readiness gate is False."""
    out = []
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get(LABEL_ROLE) != ROLE_DECODE:
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == CONDITION_SERVING and cond.get("status") == "False":
                out.append(pod["metadata"]["name"])
    return sorted(out)


def compute_status(
    spec: PDDeploymentSpec,
    observed: Observed,
    previous: PDDeploymentStatus,
    *,
    generation: int | None,
    now: datetime,
    selectors: dict[str, str],
    apply_error: str | None = None,
) -> PDDeploymentStatus:
    """The new status: per-role counts, Ready/Progressing/Degraded and a phase."""
    roles: dict[str, RoleStatus] = {}
    settled_all = True
    desired_of = {
        ROLE_PREFILL: spec.prefill.replicas,
        ROLE_DECODE: spec.decode.replicas,
        ROLE_ROUTER: spec.router.replicas,
    }
    for role, desired in desired_of.items():
        want, ready, updated, settled = _role_counts(observed.workloads.get(role), desired)
        settled_all = settled_all and settled
        fields: dict[str, Any] = dict(
            replicas=want,
            ready_replicas=ready,
            updated_replicas=updated,
            summary=f"{ready}/{want}",
            selector=selectors.get(role, ""),
        )
        if role == ROLE_DECODE:
            roles[role] = DecodeStatus(
                **fields, cordoned_replicas=len(cordoned_pods(observed.pods))
            )
        else:
            roles[role] = RoleStatus(**fields)

    problems = pod_problems(observed.pods)
    if apply_error:
        problems.insert(0, apply_error)
    conditions = list(previous.conditions)
    conditions = set_condition(
        conditions,
        "Degraded",
        status=bool(problems),
        reason=("ApplyFailed" if apply_error else "PodsFailing") if problems else "AsExpected",
        message="; ".join(problems[:10]),
        now=now,
        generation=generation,
    )
    progressing = not settled_all and not apply_error
    conditions = set_condition(
        conditions,
        "Progressing",
        status=progressing,
        reason="RollingOut" if progressing else "Settled",
        message=_progress_message(roles) if progressing else "every role runs its desired replicas",
        now=now,
        generation=generation,
    )
    ready = settled_all and not problems
    conditions = set_condition(
        conditions,
        "Ready",
        status=ready,
        reason="AllReplicasReady" if ready else "NotReady",
        message=_progress_message(roles),
        now=now,
        generation=generation,
    )
    phase = phase_of(conditions)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": phase,
            "conditions": conditions,
            "prefill": roles[ROLE_PREFILL],
            "decode": roles[ROLE_DECODE],
            "router": roles[ROLE_ROUTER],
        }
    )


def _progress_message(roles: dict[str, RoleStatus]) -> str:
    return ", ".join(
        f"{role} {r.ready_replicas}/{r.replicas} ready, {r.updated_replicas} updated"
        for role, r in roles.items()
    )
