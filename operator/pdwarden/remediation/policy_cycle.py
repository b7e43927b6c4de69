"""One scrape-detect-remediate cycle for a PDRemediationPolicy: pods pdwarden did not create.

Why a shell of its own: a policy's pods are found by the user's label selectors, not by owner
chain, and acted on in the only ways their owners tolerate (a label cordon, the Eviction API).
Everything else is the PDDeployment pipeline, reused, not copied: `policy.scope.select` decides
which matched pods the policy may touch (never a PDDeployment's pod, never one another policy
also selects), then `views`/`detect`/`plan` judge and decide exactly as for a PDDeployment,
`common` scrapes, writes ledger entries ahead and posts Events, and
`record.policy_status.policy_cycle_status` builds the status through `ledger.cycle_status`.

What a plan's action becomes here: FailRooms -> pdworker's admin API with the token from
spec.adminTokenSecretRef; AbortRequests -> SGLang's /abort_request (with that Secret's key as
SGLang's --admin-api-key when one is named); CordonDecode/UncordonDecode
-> the cordon label (refused while the Service does not select it: CordonUnavailable); Restart*
-> an eviction of the incarnation read again just before (the API server charges the PDB before
it checks the uid), where a PDB's refusal is held back (Skipped, in status.heldBack), not Failed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pdwarden import metrics
from pdwarden.api import (
    HeldBack,
    InvalidSpec,
    LedgerEntry,
    PDRemediationPolicySpec,
    PDRemediationPolicyStatus,
    RemediationStatus,
    parse_policy_spec,
)
from pdwarden.api.status import MAX_HISTORY
from pdwarden.constants import (
    ANNOTATION_RESET_BREAKER,
    API_VERSION,
    POLICY_KIND,
    ROLE_DECODE,
    ROLE_PREFILL,
)
from pdwarden.k8s import ApiError
from pdwarden.ports import ForeignPodApi, KubeApi, WorkerApi
from pdwarden.remediation.act.foreign import label_patch, record_eviction
from pdwarden.remediation.act.sglang import PrefillAborter, SGLangAdmin
from pdwarden.remediation.common import (
    announce_new_wedges,
    execute,
    now_utc,
    report_action,
    scrape_all,
    why,
)
from pdwarden.remediation.detect.rules import Detection, detect
from pdwarden.remediation.policy.cordon import CordonCheck, cordon_check
from pdwarden.remediation.policy.plan import Action, DecodePod, Plan, plan
from pdwarden.remediation.policy.scope import (
    ForeignPod,
    Scope,
    decode_pods_for_plan,
    foreign_pod,
    select,
)
from pdwarden.remediation.record.ledger import (
    Outcome,
    breaker_reset_at,
    ledger_entry,
    merge_history,
    missing_from,
)
from pdwarden.remediation.record.policy_status import as_deployment_status, policy_cycle_status
from pdwarden.remediation.scrape.client import Target
from pdwarden.remediation.views import DeploymentMemory, WorkerPod, pod_views, remember

log = logging.getLogger("pdwarden.remediation.policy_cycle")


@dataclass
class PolicyCycleResult:
    detection: Detection
    plan: Plan
    ledger: list[LedgerEntry]  # this cycle's entries
    status: PDRemediationPolicyStatus
    scope: Scope
    clear_reset_annotation: bool = False  # remove it once the status (with the reset) is written


@dataclass
class _Cycle:
    """What the acting half of one cycle works with."""

    body: Mapping[str, Any]
    namespace: str
    spec: PDRemediationPolicySpec
    pods: Mapping[str, ForeignPod]  # by name, as listed this cycle
    targets: Mapping[str, Target]  # by pod name, scraped this cycle
    token: str | None
    now: datetime
    held: list[HeldBack] = field(default_factory=list)


def _target(w: WorkerPod, spec: PDRemediationPolicySpec) -> Target:
    m = spec.metrics
    return Target(
        pod=w.name, uid=w.uid, role=w.role, ip=w.ip, port=m.port, rooms=w.rooms,
        engine=w.engine, metrics_path=m.path, scheme=m.scheme,
    )  # fmt: skip


def worker_pods(scope: Scope, raw: Mapping[str, Mapping[str, Any]], engine: str) -> list[WorkerPod]:
    """The eligible pods that can be scraped now: running, not terminating, with a pod IP."""
    out = []
    for role, pods in ((ROLE_PREFILL, scope.prefill), (ROLE_DECODE, scope.decode)):
        for p in pods:
            phase = (raw.get(p.name, {}).get("status") or {}).get("phase")
            if p.terminating or not p.ip or not p.uid or phase != "Running":
                continue
            rooms = engine == "pdworker" and role == ROLE_PREFILL
            out.append(WorkerPod(p.name, p.uid, role, p.ip, rooms, engine))
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


class PolicyRemediator:
    """Runs cycles for every PDRemediationPolicy of one operator process."""

    def __init__(
        self,
        client: KubeApi,
        workers: WorkerApi,
        foreign: ForeignPodApi,
        sglang: PrefillAborter | None = None,
    ) -> None:
        self.client = client
        self.workers = workers
        self.foreign = foreign
        self.sglang = sglang or SGLangAdmin()
        self.memory: dict[str, DeploymentMemory] = {}

    def forget(self, uid: str) -> None:
        self.memory.pop(uid, None)

    def recorded(self, uid: str, status: PDRemediationPolicyStatus) -> None:
        """A status write succeeded: entries it holds no longer need carrying."""
        mem = self.memory.get(uid)
        if mem is not None:
            history = (status.remediation or RemediationStatus()).history
            mem.unrecorded = missing_from(history, mem.unrecorded)[-MAX_HISTORY:]

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

    async def cordon_check(
        self, namespace: str, spec: PDRemediationPolicySpec, scope: Scope
    ) -> CordonCheck:
        ref = spec.cordon.service_ref
        selector = None
        if ref is not None:
            selector = await self.foreign.service_selector(namespace, ref.name)
        return cordon_check(spec.cordon, selector, scope.decode)

    async def cycle(
        self,
        body: Mapping[str, Any],
        spec: PDRemediationPolicySpec,
        previous: PDRemediationPolicyStatus,
    ) -> PolicyCycleResult:
        started = time.monotonic()
        meta = body["metadata"]
        namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        rem, now = spec.remediation, now_utc()
        mem = self.memory.setdefault(uid, DeploymentMemory())
        raw = await self.selected_pods(namespace, spec)
        policies = await self.namespace_policies(namespace, name, spec)
        scope = select(name, spec, policies, [foreign_pod(p) for p in raw.values()])
        check = await self.cordon_check(namespace, spec, scope)
        workers = worker_pods(scope, raw, spec.engine)
        targets = {w.uid: _target(w, spec) for w in workers}
        token = await self.admin_token(namespace, spec) if any(w.rooms for w in workers) else None
        observations = await scrape_all(self.workers, workers, targets, token)
        interval = rem.scrape_interval_seconds
        remember(mem, list(observations.values()), rem.wedge_after_seconds + 3 * interval)
        views = pod_views(workers, observations, mem, time.monotonic(), interval)
        detection = detect(views, rem.wedge_after_seconds)
        matched = (*scope.prefill_matched, *scope.decode_matched)
        stale = {v.name for v in views if v.stale} | (
            {p.name for p in matched} - {v.name for v in views}
        )
        history = merge_history(
            (previous.remediation or RemediationStatus()).history, mem.unrecorded
        )
        reset_at = breaker_reset_at(
            meta.get("annotations") or {}, meta.get("generation"),
            as_deployment_status(previous), now,
        )  # fmt: skip
        decodes = [
            replace(d, stale=d.stale or d.name in stale)
            for d in decode_pods_for_plan(spec, scope, cordoned_since(history), now)
        ]
        prefills = [
            DecodePod(p.name, p.uid, p.ready, terminating=p.terminating, stale=p.name in stale)
            for p in scope.prefill_matched
        ]
        decision = plan(
            rem, detection, decodes, history, now,
            decode_replicas=len(scope.decode_matched), breaker_reset_at=reset_at,
            engine=spec.engine, prefills=prefills,
        )  # fmt: skip
        decision = admissible(decision, check)
        await announce_new_wedges(self.client, body, mem, detection, now)
        ctx = _Cycle(
            body, namespace, spec, {p.name: p for p in matched},
            {t.pod: t for t in targets.values()}, token, now,
        )  # fmt: skip

        async def act(action: Action) -> LedgerEntry:
            return await self._act(ctx, action, decision.dry_run)

        done = await execute(mem, decision, now, act)
        for action, entry in done:
            await report_action(self.client, body, action, entry, decision.dry_run)
        ledger = [entry for _, entry in done]
        status = policy_cycle_status(
            previous=previous, spec=spec, scope=scope, cordon=check, detection=detection,
            decision=decision, history=merge_history(history, ledger), decodes=decodes,
            held_back=ctx.held, done=ledger, now=now, reset_at=reset_at,
            generation=meta.get("generation"),
        )  # fmt: skip
        metrics.SCRAPE_CYCLE_SECONDS.observe(time.monotonic() - started)
        clear = reset_at == now and ANNOTATION_RESET_BREAKER in (meta.get("annotations") or {})
        return PolicyCycleResult(detection, decision, ledger, status, scope, clear)

    async def _act(self, ctx: _Cycle, action: Action, dry_run: bool) -> LedgerEntry:
        """Perform one action (unless DryRun); never raises, the outcome says what happened."""
        if dry_run:
            metrics.REMEDIATIONS.labels(action.kind, "dry_run").inc()
            return ledger_entry(action, now=ctx.now, dry_run=True, outcome="Succeeded")
        try:
            entry = await self._perform(ctx, action)
        except Exception as e:  # contained per action: recorded as Failed, the cycle goes on
            metrics.REMEDIATIONS.labels(action.kind, "failed").inc()
            metrics.ERRORS.labels("action").inc()
            return ledger_entry(action, now=ctx.now, dry_run=False, outcome="Failed", detail=why(e))
        metrics.REMEDIATIONS.labels(action.kind, entry.outcome.lower()).inc()
        return entry

    async def _perform(self, ctx: _Cycle, action: Action) -> LedgerEntry:
        now = ctx.now

        def entry(detail: str = "", rooms: int | None = None) -> LedgerEntry:
            outcome: Outcome = "Skipped" if detail.startswith("skipped") else "Succeeded"
            return ledger_entry(
                action, now=now, dry_run=False, outcome=outcome, detail=detail, rooms=rooms
            )

        target = ctx.targets.get(action.pod)
        if action.kind == "FailRooms":
            if target is None or not target.rooms:
                return entry("skipped: this engine has no admin API to fail rooms by id", 0)
            failed = await self.workers.fail_rooms(target, action.rooms, ctx.token)
            failed = max(0, min(int(failed), len(action.rooms)))
            return entry(f"worker failed {failed} of {len(action.rooms)} rooms", failed)
        if action.kind == "AbortRequests":
            if target is None:
                return entry("skipped: the prefill pod has no address (not running)", 0)
            key = ctx.token or await self.admin_token(ctx.namespace, ctx.spec)
            report = await (
                self.sglang.abort_all(target.base, key)
                if key
                else self.sglang.abort_all(target.base)
            )
            return entry(report.detail(f"{action.pod} ({target.base})"), report.aborted)
        pod = ctx.pods.get(action.pod)
        if pod is None or pod.owned_by_pdwarden:
            return entry("skipped: the pod is no longer one this policy may act on")
        if action.kind in ("CordonDecode", "UncordonDecode"):
            patch = label_patch(action, pod, ctx.spec.cordon)
            if patch is None:
                return entry("skipped: the label already says so, or the pod was replaced")
            result = await self.foreign.set_pod_label(ctx.namespace, patch)
            if result == "Patched":
                return entry(f"label {patch.key}={patch.value}")
            return entry(f"skipped: the pod {'is gone' if result == 'Gone' else 'changed'}")
        if action.kind in ("RestartDecode", "RestartPrefill"):
            # Read again right before evicting: the API server charges the PDB before it checks
            # the uid precondition, so evicting a replaced pod would spend the budget for nothing.
            fresh = await self.client.get("v1", "Pod", ctx.namespace, action.pod)
            now_pod = foreign_pod(fresh) if fresh is not None else None
            if now_pod is None or now_pod.uid != (action.uid or pod.uid):
                return entry("skipped: the pod was already gone or replaced")
            if now_pod.owned_by_pdwarden or now_pod.terminating:
                return entry("skipped: the pod is terminating or now belongs to a PDDeployment")
            outcome = await self.foreign.evict_pod(ctx.namespace, action.pod, now_pod.uid)
            recorded, held = record_eviction(action, outcome, now)
            if held is not None:
                ctx.held.append(held)
            return recorded
        raise ValueError(f"unknown action {action.kind}")


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
