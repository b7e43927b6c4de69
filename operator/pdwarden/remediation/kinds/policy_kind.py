"""A PDRemediationPolicy, as the one cycle sees it: pods another system runs, found by selectors.

Why these choices: a policy's pods are found by the user's label selectors, and
`policy.scope.select` decides which of them the policy may touch (never a PDDeployment's pod,
never one another policy also selects). They are acted on only in the ways their owners
tolerate: a cordon is a label (admitted only while the Service in front selects it: otherwise
held back as CordonUnavailable), a restart an eviction (PodDisruptionBudgets decide). FailRooms
uses pdworker's admin API with the token from spec.adminTokenSecretRef; AbortRequests SGLang's
/abort_request with that Secret's key as its --admin-api-key. The status is the PDDeployment's
status logic on the policy's status (`record.policy_report`).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pdwarden.api import (
    InvalidSpec,
    LedgerEntry,
    PDDeploymentStatus,
    PDRemediationPolicySpec,
    PDRemediationPolicyStatus,
    parse_policy_spec,
)
from pdwarden.constants import API_VERSION, POLICY_KIND, ROLE_DECODE, ROLE_PREFILL
from pdwarden.k8s import ApiError
from pdwarden.ports import ForeignPodApi, KubeApi
from pdwarden.remediation.act import pod_label, restart
from pdwarden.remediation.act.done import Done, skipped
from pdwarden.remediation.decide import Plan, PlannedAction, PodState
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import (
    DeploymentMemory,
    WorkerPod,
    token_with_fallback,
    worker_pod,
)
from pdwarden.remediation.policy.cordon import CordonCheck, cordon_check
from pdwarden.remediation.policy.scope import (
    ForeignPod,
    Scope,
    decode_pods_for_plan,
    foreign_pod,
    select,
)
from pdwarden.remediation.record.policy_report import as_deployment_status, policy_cycle_status
from pdwarden.remediation.seams import Seen
from pdwarden.values import Target

log = logging.getLogger("pdwarden.remediation.kinds.policy_kind")


@dataclass
class PolicySeen(Seen):
    """What a policy's cycle found: the pods, what selection decided, and the cordon check."""

    scope: Scope = field(default_factory=Scope)
    check: CordonCheck = field(default_factory=lambda: CordonCheck(None, "NotChecked", ""))
    matched: Mapping[str, ForeignPod] | None = None  # by name: every pod either selector matched

    def foreign(self, name: str) -> ForeignPod | None:
        return (self.matched or {}).get(name)

    def advised(self) -> Sequence[Mapping[str, Any]]:
        """Matched pods the policy does not refuse: one a PDDeployment owns is reported there,
        one selected twice is the Conflict condition's."""
        refused = self.scope.refused_names
        return [p for p in self.pods if (p.get("metadata") or {}).get("name") not in refused]


def worker_pods(scope: Scope, raw: Mapping[str, Mapping[str, Any]], engine: str) -> list[WorkerPod]:
    """The eligible pods that can be scraped now: running, not terminating, with a pod IP."""
    out = []
    for role, pods in ((ROLE_PREFILL, scope.prefill), (ROLE_DECODE, scope.decode)):
        for p in pods:
            phase = (raw.get(p.name, {}).get("status") or {}).get("phase")
            if p.terminating or not p.ip or not p.uid or phase != "Running":
                continue
            out.append(worker_pod(raw.get(p.name, {}), engine, p.name, p.uid, role, ip=p.ip))
    return out


def cordoned_since(history: Sequence[LedgerEntry]) -> dict[str, datetime]:
    """When each pod was last cordoned for real (the ledger's latest succeeded CordonDecode)."""
    out: dict[str, datetime] = {}
    for e in history:
        if e.action == "CordonDecode" and e.outcome == "Succeeded" and not e.dry_run:
            out[e.pod] = e.time
    return out


def admissible(decision: Plan, check: CordonCheck) -> Plan:
    """The plan without the cordons the label cannot carry out (the Service does not select
    it): they are held back with the reason, which the RemediationSuspended condition shows."""
    if check.allows_cordon:
        return decision
    dropped = [a for a in decision.actions if a.kind == "CordonDecode"]
    if not dropped:
        return decision
    return replace(
        decision,
        actions=tuple(a for a in decision.actions if a.kind != "CordonDecode"),
        held_back=decision.held_back
        + tuple(f"CordonDecode {a.pod}: {check.reason}: {check.message}" for a in dropped),
    )


class PolicyKind:
    """The PDRemediationPolicy side of the cycle (satisfies `seams.Kind`)."""

    name = POLICY_KIND

    def __init__(self, client: KubeApi, foreign: ForeignPodApi) -> None:
        self.client = client
        self.foreign = foreign

    async def selected_pods(
        self, namespace: str, spec: PDRemediationPolicySpec
    ) -> dict[str, dict[str, Any]]:
        """Every pod either selector matches, listed by the API server with the selector."""
        out: dict[str, dict[str, Any]] = {}
        for sel in (spec.prefill_selector, spec.decode_selector):
            for p in await self.client.list("v1", "Pod", namespace, sel.to_query()):
                out[str((p.get("metadata") or {}).get("name", ""))] = p
        return out

    async def namespace_policies(
        self, namespace: str, name: str, spec: PDRemediationPolicySpec
    ) -> dict[str, PDRemediationPolicySpec]:
        """Every valid policy of the namespace (this one as given), for conflicts."""
        out = {}
        for obj in await self.client.list(API_VERSION, POLICY_KIND, namespace, ""):
            other = str((obj.get("metadata") or {}).get("name", ""))
            try:
                out[other] = parse_policy_spec(obj.get("spec") or {})
            except InvalidSpec:
                continue  # the API server's schema refuses these; one that slips by claims nothing
        out[name] = spec
        return out

    async def admin_token(self, namespace: str, spec: PDRemediationPolicySpec) -> str | None:
        """The token in spec.adminTokenSecretRef (read by name, the only Secret read)."""
        ref = spec.admin_token_secret_ref
        if ref is None:
            return None
        try:
            secret = await self.client.get("v1", "Secret", namespace, ref.name)
        except ApiError as e:
            log.warning("%s: cannot read Secret %s for the admin token: %s", namespace, ref.name, e)
            return None
        raw = ((secret or {}).get("data") or {}).get(ref.key)
        try:
            return base64.b64decode(raw).decode().strip() if raw else None
        except (binascii.Error, UnicodeDecodeError, TypeError):
            return None

    async def observe(
        self, body: Mapping[str, Any], spec: PDRemediationPolicySpec, mem: DeploymentMemory
    ) -> PolicySeen:
        meta = body["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        raw = await self.selected_pods(namespace, spec)
        policies = await self.namespace_policies(namespace, name, spec)
        scope = select(name, spec, policies, [foreign_pod(p) for p in raw.values()])
        ref = spec.cordon.service_ref
        selector = await self.foreign.service_selector(namespace, ref.name) if ref else None
        check = cordon_check(spec.cordon, selector, scope.decode)
        workers = worker_pods(scope, raw, spec.engine)
        m = spec.metrics
        targets = {
            w.uid: Target(pod=w.name, uid=w.uid, role=w.role, ip=w.ip, port=m.port,
                          rooms=w.rooms, engine=w.engine, metrics_path=m.path, scheme=m.scheme,
                          bootstrap_port=w.bootstrap_port)
            for w in workers
        }  # fmt: skip
        token, fallback = (
            token_with_fallback(mem, await self.admin_token(namespace, spec))
            if any(w.rooms for w in workers)
            else (None, None)
        )
        matched = {p.name: p for p in (*scope.prefill_matched, *scope.decode_matched)}
        scraped = {w.name for w in workers}
        return PolicySeen(
            namespace=namespace, tenant=str(meta["uid"]), pods=list(raw.values()),
            workers=workers, targets=targets, token=token, fallback_token=fallback,
            unjudged=frozenset(n for n in matched if n not in scraped),
            decode_replicas=len(scope.decode_matched), scope=scope, check=check,
            matched=matched,
        )  # fmt: skip

    def serving(
        self, spec: PDRemediationPolicySpec, seen: PolicySeen, stale: set[str],
        history: Sequence[LedgerEntry], now: datetime,
    ) -> tuple[list[PodState], list[PodState]]:  # fmt: skip
        decodes = [
            replace(d, stale=d.stale or d.name in stale)
            for d in decode_pods_for_plan(spec, seen.scope, cordoned_since(history), now)
        ]
        prefills = [
            PodState(p.name, p.uid, p.ready, terminating=p.terminating, stale=p.name in stale)
            for p in seen.scope.prefill_matched
        ]
        return decodes, prefills

    def admit(self, decision: Plan, seen: PolicySeen) -> Plan:
        return admissible(decision, seen.check)

    async def cordon(
        self, spec: PDRemediationPolicySpec, seen: PolicySeen, action: PlannedAction, now: datetime
    ) -> Done:
        pod = seen.foreign(action.pod)
        if pod is None or pod.owned_by_pdwarden:
            return skipped("the pod is no longer one this policy may act on")
        return await pod_label.relabel(self.foreign, seen.namespace, action, pod, spec.cordon)

    async def restart(
        self, spec: PDRemediationPolicySpec, seen: PolicySeen, action: PlannedAction, now: datetime
    ) -> Done:
        pod = seen.foreign(action.pod)
        if pod is None or pod.owned_by_pdwarden:
            return skipped("the pod is no longer one this policy may act on")
        # Read again right before evicting (act.restart.evict): the API server charges the PDB
        # before it checks the uid precondition.
        planned = action if action.uid else replace(action, uid=pod.uid)
        return await restart.evict(self.client, self.foreign, seen.namespace, planned, now)

    async def sglang_key(self, spec: PDRemediationPolicySpec, seen: PolicySeen) -> str | None:
        return seen.token or await self.admin_token(seen.namespace, spec)

    def applied(
        self, spec: PDRemediationPolicySpec, seen: PolicySeen, entry: LedgerEntry
    ) -> bool | None:
        """Whether a Pending cordon, uncordon or eviction landed; None: the pod cannot say."""
        pod = seen.foreign(entry.pod)
        if entry.action in ("RestartDecode", "RestartPrefill"):
            return pod is None or pod.uid != entry.uid or pod.terminating
        if pod is None or (entry.uid and pod.uid != entry.uid):
            return None
        action = PlannedAction(entry.action, entry.pod, entry.reason, uid=entry.uid or "")
        return pod_label.applied(action, pod, spec.cordon)

    def reconstruct(
        self, seen: PolicySeen, history: Sequence[LedgerEntry], now: datetime
    ) -> list[LedgerEntry]:
        return []  # a label is not evidence of pdwarden: a person may have set it

    def shared_status(self, status: PDRemediationPolicyStatus) -> PDDeploymentStatus:
        return as_deployment_status(status)

    def status(
        self, previous: PDRemediationPolicyStatus, spec: PDRemediationPolicySpec,
        seen: PolicySeen, *, detection: Detection, decision: Plan,
        history: Sequence[LedgerEntry], decodes: Sequence[PodState],
        done: Sequence[LedgerEntry], now: datetime, reset_at: datetime | None,
        generation: int | None, advisories: Sequence[PodAdvice],
    ) -> PDRemediationPolicyStatus:  # fmt: skip
        return policy_cycle_status(
            previous=previous, spec=spec, scope=seen.scope, cordon=seen.check,
            detection=detection, decision=decision, history=history, decodes=decodes,
            held_back=seen.held, done=done, now=now, reset_at=reset_at, generation=generation,
            advisories=advisories, screen=seen.screen,
        )  # fmt: skip


def effective_policy_spec(
    body: Mapping[str, Any], global_dry_run: bool
) -> PDRemediationPolicySpec | None:
    """The spec a cycle runs with (global dry run applied), or None for mode Off or a spec that
    does not parse (the API server's schema refuses those at the door)."""
    try:
        spec = parse_policy_spec(body.get("spec") or {})
    except InvalidSpec:
        return None
    if global_dry_run and spec.remediation.mode == "Enforce":
        spec = spec.model_copy(
            update={"remediation": spec.remediation.model_copy(update={"mode": "DryRun"})}
        )
    return None if spec.remediation.mode == "Off" else spec
