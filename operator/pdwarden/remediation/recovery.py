"""Completing what a dead replica started: Pending ledger entries, settled from what pods show.

Why: the cycle writes an action's intent (a Pending entry) to the API server before the action
and completes it after. A replica killed in between leaves the Pending entry; the next cycle of
whichever replica runs it completes the entry once it is older than SETTLE_AFTER (long enough
for any call the dead replica had in flight to have landed or failed):

* a cordon, uncordon or restart is read back from the pod (the kind knows how: a readiness-gate
  condition and its time, a label, the pod's uid): done -> Succeeded; not done -> Skipped
  ("not performed"), which the breaker does not count and after which the plan decides afresh;
  cannot tell (the pod was replaced) -> Succeeded, counted, and the entry says so;
* FailRooms is completed by doing it: the worker's fail call is idempotent, so asking again
  for the entry's room ids fails what is still wedged and nothing twice;
* AbortRequests cannot be read back from SGLang: counted as done, and the entry says so.

Each entry keeps its id and decision time, so budgets count it exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from pdwarden.api import LedgerEntry
from pdwarden.api.status import MAX_MESSAGE, LedgerOutcome
from pdwarden.remediation.act import worker_admin
from pdwarden.remediation.record.ledger import pending
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.seams import Round, Seen, Tools

SETTLE_AFTER: Final = timedelta(seconds=20)
RECOVERED: Final = "recovered after a failover"


def completed(
    entry: LedgerEntry, outcome: LedgerOutcome, detail: str, rooms: int | None = None
) -> LedgerEntry:
    """The entry with its outcome, the detail appended to its reason, its room ids dropped."""
    reason = sanitize.text(f"{entry.reason}; {detail}", MAX_MESSAGE)
    update: dict[str, Any] = {"outcome": outcome, "reason": reason, "room_ids": None}
    if rooms is not None:
        update["rooms"] = rooms
    return entry.model_copy(update=update)


async def settle(r: Round[Any, Any, Any], history: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """Completed forms of the Pending entries old enough to settle (none in a normal cycle)."""
    return [
        await _settle_one(r, entry)
        for entry in pending(history)
        if r.now - entry.time >= SETTLE_AFTER
    ]


async def _settle_one(r: Round[Any, Any, Any], entry: LedgerEntry) -> LedgerEntry:
    if entry.action == "FailRooms":
        return await _fail_again(r.tools, r.seen, entry)
    if entry.action == "AbortRequests":
        return completed(
            entry, "Succeeded", f"{RECOVERED}: SGLang cannot say whether the abort ran; counted"
        )
    done = r.kind.applied(r.spec, r.seen, entry)
    if done is None:
        return completed(
            entry, "Succeeded", f"{RECOVERED}: the pod was replaced, cannot confirm; counted"
        )
    if done:
        return completed(entry, "Succeeded", f"{RECOVERED}: the pod shows it was done")
    return completed(
        entry, "Skipped", f"not performed: the replica that decided it stopped first ({RECOVERED})"
    )


async def _fail_again(tools: Tools, seen: Seen, entry: LedgerEntry) -> LedgerEntry:
    target = seen.target(entry.pod)
    ids = list(entry.room_ids or ())
    if target is None or not target.rooms or not ids:
        return completed(
            entry, "Skipped", f"not completed: the prefill pod is gone or no ids ({RECOVERED})", 0
        )
    try:
        failed = await worker_admin.fail_rooms(
            tools.admin, target, ids, seen.token, seen.fallback_token
        )
    except Exception as e:  # recorded; the breaker counts a Failed entry like a done one
        return completed(
            entry, "Failed", f"could not be completed ({RECOVERED}): {sanitize.why(e)}"
        )
    failed = max(0, min(int(failed), len(ids)))
    return completed(
        entry, "Succeeded",
        f"{RECOVERED}: asked again, the worker failed {failed} of {len(ids)} rooms now (the "
        "rest were failed before or finished)", failed,
    )  # fmt: skip
