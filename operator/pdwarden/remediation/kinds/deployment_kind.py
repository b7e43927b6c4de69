"""A PDDeployment, as the one cycle sees it: pods pdwarden runs, cordoned by a readiness gate.

Why these choices: a PDDeployment's worker pods are found by its labels and kept only if their
owner chain leads to it (a look-alike with our labels is never scraped with the token, judged or
acted on); a cordon is the `pdwarden.dev/serving` pod condition its decode pods list in their
readinessGates; a restart is a delete with a uid precondition (its StatefulSet recreates the
pod). The admin token comes from the operator's key (derived per deployment) or the Secret it
rendered. The status is `record.ledger.cycle_status`, merged with reconcile's by the store.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pdwarden.api import LedgerEntry, PDDeploymentSpec, PDDeploymentStatus
from pdwarden.api.status import MAX_HISTORY
from pdwarden.conditions import kube_time
from pdwarden.constants import KIND, LABEL_ROLE, ROLE_PREFILL, WORKER_PORT
from pdwarden.ownership import Workloads, owned_chain, selector
from pdwarden.ports import KubeApi
from pdwarden.remediation.act import pod_condition, restart
from pdwarden.remediation.act.done import Done
from pdwarden.remediation.decide import Plan, PlannedAction, PodState
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import (
    WORKER_ROLES,
    DeploymentMemory,
    decode_pods,
    scrape_targets,
    token_with_fallback,
)
from pdwarden.remediation.record.ledger import cycle_status, new_entry_id
from pdwarden.remediation.seams import Obj, Seen
from pdwarden.render import Owner, names
from pdwarden.tokens import TokenKey, derive_token
from pdwarden.values import Target

log = logging.getLogger("pdwarden.remediation.kinds.deployment_kind")
CLOCK_SLACK_SECONDS = 2.0


def _name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


class DeploymentKind:
    """The PDDeployment side of the cycle (satisfies `seams.Kind`)."""

    name = KIND

    def __init__(self, client: KubeApi, token_key: TokenKey | None = None) -> None:
        self.client = client
        self.token_key = token_key

    async def admin_tokens(
        self, owner: Owner, mem: DeploymentMemory
    ) -> tuple[str | None, str | None]:
        """The admin token to use and the one to fall back on: with a token key, the tokens
        of the key and of the key a rotation replaced; without, the Secret's token and the one
        read before it."""
        if self.token_key is None:
            return token_with_fallback(mem, await self.secret_token(owner))
        current, old = (
            derive_token(k, owner.namespace, owner.name, owner.uid) if k else None
            for k in (self.token_key.current(), self.token_key.previous())
        )
        return current, old

    async def secret_token(self, owner: Owner) -> str | None:
        """The token in the deployment's admin Secret (no token key: the operator reads it)."""
        secret = await self.client.get(
            "v1", "Secret", owner.namespace, names(owner.name).admin_secret
        )
        data = (secret or {}).get("data") or {}
        try:
            return base64.b64decode(data["token"]).decode() if "token" in data else None
        except (binascii.Error, UnicodeDecodeError, TypeError):
            return None

    async def our_pods(self, owner: Owner, mem: DeploymentMemory) -> list[dict[str, Any]]:
        """Worker pods whose owner chain leads to this PDDeployment; look-alikes carrying our
        labels are never scraped with the token, judged or acted on (and reported once)."""
        sel = selector(owner.name)
        sets = await self.client.list("apps/v1", "StatefulSet", owner.namespace, sel)
        pods = await self.client.list("v1", "Pod", owner.namespace, sel)
        workloads = Workloads.of(sets, (), owner.uid)
        mine, foreign = [], set()
        for p in pods:
            meta = p.get("metadata") or {}
            if (meta.get("labels") or {}).get(LABEL_ROLE) not in WORKER_ROLES:
                continue  # the router: never scraped, never acted on
            if owned_chain(p, workloads):
                mine.append(p)
            elif not meta.get("deletionTimestamp"):
                foreign.add(str(meta.get("name")))
        if foreign - mem.foreign:
            log.warning(
                "%s/%s: ignoring pod(s) with our labels but not our owner chain: %s",
                owner.namespace, owner.name, ", ".join(sorted(foreign - mem.foreign)),
            )  # fmt: skip
        mem.foreign = foreign
        return mine

    async def observe(self, body: Obj, spec: PDDeploymentSpec, mem: DeploymentMemory) -> Seen:
        meta = body["metadata"]
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        pods = await self.our_pods(owner, mem)
        workers = scrape_targets(pods, spec.engine)
        token, fallback = (
            await self.admin_tokens(owner, mem) if any(w.rooms for w in workers) else (None, None)
        )
        targets = {
            w.uid: Target(pod=w.name, uid=w.uid, role=w.role, ip=w.ip, port=WORKER_PORT,
                          rooms=w.rooms, engine=w.engine, bootstrap_port=w.bootstrap_port)
            for w in workers
        }  # fmt: skip
        scraped = {w.name for w in workers}
        return Seen(
            namespace=owner.namespace, tenant=owner.uid, pods=pods, workers=workers,
            targets=targets, token=token, fallback_token=fallback,
            unjudged=frozenset(_name(p) for p in pods if _name(p) not in scraped),
            decode_replicas=spec.decode.replicas,
        )  # fmt: skip

    def serving(
        self, spec: PDDeploymentSpec, seen: Seen, stale: set[str],
        history: Sequence[LedgerEntry], now: datetime,
    ) -> tuple[list[PodState], list[PodState]]:  # fmt: skip
        return (
            decode_pods(seen.pods, stale, now),
            decode_pods(seen.pods, stale, now, role=ROLE_PREFILL),
        )

    def admit(self, decision: Plan, seen: Seen) -> Plan:
        return decision  # the readiness gate carries every cordon

    async def cordon(
        self, spec: PDDeploymentSpec, seen: Seen, action: PlannedAction, now: datetime
    ) -> Done:
        return await pod_condition.set_serving(self.client, seen.namespace, action, now)

    async def restart(
        self, spec: PDDeploymentSpec, seen: Seen, action: PlannedAction, now: datetime
    ) -> Done:
        return await restart.delete(self.client, seen.namespace, action)

    async def sglang_key(self, spec: PDDeploymentSpec, seen: Seen) -> str | None:
        return None  # pdwarden renders SGLang pods without --admin-api-key

    def applied(self, spec: PDDeploymentSpec, seen: Seen, entry: LedgerEntry) -> bool | None:
        """Whether a Pending cordon, uncordon or restart landed; None: the pod cannot say."""
        pod = seen.pod(entry.pod)
        if entry.action in ("RestartDecode", "RestartPrefill"):
            if pod is None or _uid(pod) != entry.uid:
                return True  # that incarnation is gone: deleted (by us, or since)
            return bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        if pod is None or (entry.uid and _uid(pod) != entry.uid):
            return None
        return pod_condition.applied(pod, entry.action, entry.time)

    def reconstruct(
        self, seen: Seen, history: Sequence[LedgerEntry], now: datetime
    ) -> list[LedgerEntry]:
        """Cordons pdwarden set (the pod's serving condition says so) that the ledger does not
        hold: a backstop for a ledger written by a version without intents, or edited."""
        out = []
        for pod in seen.pods:
            c = pod_condition.serving(pod)
            if c is None or c.get("reason") != pod_condition.CORDONED:
                continue
            if not str(c.get("message") or "").startswith(pod_condition.MESSAGE_PREFIX):
                continue
            since = kube_time(c.get("lastTransitionTime"))
            if since is None or _recorded(history, _name(pod), since):
                continue
            if len(history) >= MAX_HISTORY and since < history[0].time:
                continue  # older than the whole ledger: its entry was rotated out, not lost
            out.append(
                LedgerEntry(
                    id=new_entry_id(), time=since, action="CordonDecode", pod=_name(pod),
                    uid=_uid(pod) or None, outcome="Succeeded",
                    reason="recovered: the pod shows a cordon pdwarden set that the ledger did "
                    "not hold",
                )
            )  # fmt: skip
        return out

    def shared_status(self, status: PDDeploymentStatus) -> PDDeploymentStatus:
        return status

    def status(
        self, previous: PDDeploymentStatus, spec: PDDeploymentSpec, seen: Seen, *,
        detection: Detection, decision: Plan, history: Sequence[LedgerEntry],
        decodes: Sequence[PodState], done: Sequence[LedgerEntry], now: datetime,
        reset_at: datetime | None, generation: int | None, advisories: Sequence[PodAdvice],
    ) -> PDDeploymentStatus:  # fmt: skip
        return cycle_status(
            previous=previous, policy=spec.remediation, generation=generation,
            detection=detection, decision=decision, history=history, decodes=decodes, now=now,
            reset_at=reset_at, advisories=advisories, screen=seen.screen,
        )  # fmt: skip


def _recorded(history: Sequence[LedgerEntry], pod: str, since: datetime) -> bool:
    """The ledger holds the cordon a condition shows: an entry for that pod decided when the
    condition says (the cycle stamps both with its one clock reading)."""
    return any(
        e.action == "CordonDecode" and e.pod == pod and not e.dry_run
        and abs((e.time - since).total_seconds()) <= CLOCK_SLACK_SECONDS
        for e in history
    )  # fmt: skip
