"""The repair ladder: findings + spec + ledger + pod states -> the actions to take now.

Why pure: this is the part that can turn a wedge into an outage if it is wrong, so it is a
function of plain data with no clock and no client, unit-tested case by case. Each rung is one
function in `rungs`; which prefill rung repairs which finding is each engine's data
(`Engine.prefill_rungs`, engines/). The ladder:

1. FailRooms: fail wedged rooms on the prefill side (they will never complete).
2. CordonDecode: take a decode pod out of service (readiness gate False) when it is stalled, or
   when wedged rooms point at it again after their rooms were already failed once (repeat).
3. RestartDecode: delete a cordoned decode pod that still makes no progress restartAfterSeconds
   after the cordon; its StatefulSet recreates it.
4. UncordonDecode: put a cordoned pod back when its stall has cleared.

On stock SGLang (no rooms API, so findings carry no room ids) rung 1 is replaced per prefill pod
(`rungs.abort_requests`):

1a. AbortRequests: abort every request of the wedged prefill pod (SGLang's only way to free
    wedged rooms; it costs every request the pod holds, which the ledger records).
1b. RestartPrefill (opt-in): delete that prefill pod when it is still, or again, wedged
    restartAfterSeconds after the abort; at most one prefill pod restarting at a time. An abort
    older than restartAfterSeconds + wedgeAfterSeconds is a finished repair: a wedge after that
    starts the ladder again at 1a.

On stock vLLM (the decode PULLS the KV; no rooms API; abort by request id only under
--enable-scale-out, which pdwarden does not render) a decode's read stuck on a frozen prefill
(KVReadStuck, detect/pull.py) has one repair vLLM supports (`rungs.restart_read_peer`):

1v. RestartPrefill (opt-in, as for SGLang): delete the one prefill pod the finding names as its
    peer (the only prefill not proven alive); never when it is stale, already restarting, or
    another prefill is not ready; then nothing for restartAfterSeconds (or the cooldown, if
    longer) while the new pod starts. Deleting the prefill ends the decode's read
    (NIXL_ERR_REMOTE_DISCONNECT); with kv_load_failure_policy recompute the decode recomputes
    the request instead of failing it. LateNotification is reported only.

A decode whose engine froze behind its live API server shows nothing on its own metrics
(running = waiting = 0: requests never reach its scheduler) and answers /health 200 (vLLM 0.32
AsyncLLM.check_health, v1/engine/async_llm.py:1089, fails only once the engine core died); only
a prefill's LeaseExpired shows it, naming as suspects the decodes whose token counter did not
move (detect/pull.py). So on vLLM the cycle asks each suspect, and each decode cordoned by us,
for one token (remediation.confirm.canary: GET /v1/models, which the API server answers from
its configuration without the engine, entrypoints/openai/models/serving.py:64; then a one-token
completion under a deadline; folded in by decide.verdicts) before this plan runs, unless a pair
canary judged that decode this cycle or still holds it dead (decide.pairs, `held_dead`):

2v. A decode the canary confirms dead is stalled for rungs 2-4: CordonDecode, then RestartDecode
    restartAfterSeconds after the cordon while it stays dead. One it finds alive again is
    uncordoned as before (healthy for a full window); alive and unknown never start anything.
    A confirmed-dead decode serves nobody, so it counts neither as serving (it is cordoned even
    when it is the last ready decode) nor against maxUnavailableDecode (cordoning it takes no
    capacity away, and it does not use up the budget of the others).

Safety envelope: mode Off/DryRun/Enforce; at most maxUnavailableDecode decode pods cordoned or
not ready, and never the last ready one (rung 2v says why a confirmed-dead decode is neither);
a cooldown per pod; a circuit breaker on actions per hour; never an action on, or attributed
to, a pod whose metrics are stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pdwarden import engines
from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide.actions import Plan, PodState
from pdwarden.remediation.decide.budget import breaker, decode_budget
from pdwarden.remediation.decide.deciding import Deciding
from pdwarden.remediation.decide.rungs import PREFILL_RUNGS, decode_rung
from pdwarden.remediation.detect.rules import Detection


def plan(
    spec: RemediationSpec,
    detection: Detection,
    decodes: Sequence[PodState],
    history: Sequence[LedgerEntry],
    now: datetime,
    *,
    decode_replicas: int,
    breaker_reset_at: datetime | None = None,
    engine: str = "pdworker",
    prefills: Sequence[PodState] = (),
) -> Plan:
    """Decide this round's actions. Nothing here performs them.

    `prefills` are the prefill pods (only the prefill restart rungs read them).
    """
    dry_run = spec.mode == "DryRun"
    budget = decode_budget(spec, decode_replicas)
    if spec.mode == "Off":
        return Plan(budget=budget)
    state = breaker(
        history, now, dry_run=dry_run, reset_at=breaker_reset_at, limit=spec.max_actions_per_hour
    )
    d = Deciding(
        spec, detection, decodes, prefills, history, now, budget, state.used,
        unsettled={e.pod: e for e in history if e.outcome == "Pending" and e.dry_run == dry_run},
    )  # fmt: skip
    rungs = engines.get(engine).prefill_rungs
    for f in detection.findings:  # 1. the prefill side, as the engine repairs it
        if (rung := rungs.get(f.reason)) is not None:
            PREFILL_RUNGS[rung](d, f)
    for pod in sorted(decodes, key=lambda p: p.name):  # 2-4. decode pods
        decode_rung(d, pod)
    return Plan(
        actions=tuple(d.actions),
        suspended=state.open,
        budget=budget,
        held_back=tuple(d.held),
        dry_run=dry_run,
    )
