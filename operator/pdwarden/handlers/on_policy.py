"""What the kopf handlers of PDRemediationPolicy do, as plain async functions (main.py registers).

Why separate from on_deployment.py: a policy has no reconcile pass, only its remediation daemon,
and its own status model and memory; sharing the process-wide clients is all it needs of the
PDDeployment side. Its cycle is the same one (`handlers.daemon`): every pass over one policy is
serialized and every error is contained: a failed cycle is logged and counted (metric
pdwarden_operator_errors, stage "policy_cycle") and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdwarden import metrics
from pdwarden.api import InvalidSpec, PDRemediationPolicyStatus, parse_policy_spec
from pdwarden.constants import POLICY_KIND
from pdwarden.handlers.daemon import daemon_cycle, names, tools_for
from pdwarden.k8s.event_sink import post_event
from pdwarden.ports import (
    AdminApi,
    CanaryApi,
    ForeignPodApi,
    KubeApi,
    PairCanaryApi,
    ScreenApi,
    WorkerApi,
)
from pdwarden.remediation.act.sglang_abort import PrefillAborter
from pdwarden.remediation.act.worker_admin import WorkerAdmin
from pdwarden.remediation.kinds.policy_kind import PolicyKind, effective_policy_spec
from pdwarden.remediation.memory import DeploymentMemory
from pdwarden.remediation.record.policy_report import inactive_status
from pdwarden.remediation.record.store import POLICY, StatusCache, write
from pdwarden.remediation.seams import Tools, now_utc


@dataclass
class PolicyState:
    """Process-wide state of the policy path, kept in kopf's memo next to OperatorState."""

    client: KubeApi
    workers: WorkerApi
    foreign: ForeignPodApi
    admin: AdminApi = field(default_factory=WorkerAdmin)
    global_dry_run: bool = False
    sglang: PrefillAborter | None = None
    canary: CanaryApi | None = None  # default: on the tenant shares of `workers`
    pair: PairCanaryApi | None = None  # default: on the tenant shares of `workers`
    screen: ScreenApi | None = None  # prometheus mode's screen (None: direct mode)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    statuses: StatusCache[PDRemediationPolicyStatus] = field(init=False)
    kind: PolicyKind = field(init=False)
    tools: Tools = field(init=False)
    memory: dict[str, DeploymentMemory] = field(default_factory=dict)
    # Finished cycles per policy UID: progress a test can wait for before asserting that
    # nothing happened.
    cycles: Counter[str] = field(default_factory=Counter)
    # UIDs of policies found deleted behind kopf's back (`handlers.daemon.vanished`).
    gone: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.statuses = StatusCache(POLICY, self.client)
        self.kind = PolicyKind(self.client, self.foreign)
        self.tools = tools_for(
            self.client, self.workers, self.admin, self.sglang, self.canary, pair=self.pair,
            screen=self.screen,
        )  # fmt: skip

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())


async def policy_cycle(state: PolicyState, body: Mapping[str, Any]) -> float:
    """One cycle of one policy; returns the seconds until the next. Never raises (except
    cancellation)."""
    return await daemon_cycle(
        state, body, lambda: effective_policy_spec(body, state.global_dry_run),
        parse=parse_policy_spec, stage="policy_cycle", what="policy cycle",
        counter=metrics.POLICY_CYCLES, idle=lambda: report_inactive(state, body),
    )  # fmt: skip


async def report_inactive(state: PolicyState, body: Mapping[str, Any]) -> None:
    """Mode Off or an invalid spec: no cycle runs, and the status says which (written only on
    change); an invalid spec also gets a Warning Event when its status first says so."""
    uid = str(body["metadata"]["uid"])
    namespace, name = names(body)
    try:
        parse_policy_spec(body.get("spec") or {})
        invalid = None
    except InvalidSpec as e:
        invalid = f"invalid spec: {e}"
    async with state.lock_for(uid):
        previous = await state.statuses.current(body)
        status = inactive_status(previous.status, invalid=invalid, now=now_utc(),
                                 generation=body["metadata"].get("generation"))  # fmt: skip
        known = await write(POLICY, state.client, namespace, name, base=previous, new=status)
        state.statuses.remember(uid, known)
        if invalid is not None and known.status != previous.status:
            await post_event(state.client, dict(body), "InvalidSpec", invalid, "Warning")


def policy_gone(state: PolicyState, body: Mapping[str, Any]) -> bool:
    """Whether the policy was found deleted behind kopf's back: its daemon ends."""
    return str(body["metadata"]["uid"]) in state.gone


def forget_policy(state: PolicyState, body: Mapping[str, Any]) -> None:
    uid = str(body["metadata"]["uid"])
    state.locks.pop(uid, None)
    state.statuses.forget(uid)
    state.cycles.pop(uid, None)
    state.memory.pop(uid, None)
    state.workers.forget(uid)
    with contextlib.suppress(KeyError):
        metrics.POLICY_CYCLES.remove(*names(body))
    for gauge in metrics.PER_OBJECT:
        with contextlib.suppress(KeyError):
            gauge.remove(POLICY_KIND, *names(body))
