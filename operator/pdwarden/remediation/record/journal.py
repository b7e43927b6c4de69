"""Intents on the API server: a Pending ledger entry written before its action, one write each.

Why: the ledger is only an audit trail if an action can never happen without its entry. The
cycle hands each intent here before it acts; it is appended to the object's status with the
store's resourceVersion-guarded write (on a conflict the ledgers are merged, nothing is lost),
and the status this write leaves becomes the base of the cycle's own status write, which then
replaces each Pending entry with its completed form (same id, `ledger.merge_history`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pdwarden.api import LedgerEntry, RemediationStatus
from pdwarden.api.base import StatusModel
from pdwarden.ports import KubeApi
from pdwarden.remediation.record.ledger import merge_history
from pdwarden.remediation.record.store import Known, StatusCache, write

S = TypeVar("S", bound=StatusModel)


def with_entry(status: S, entry: LedgerEntry) -> S:
    """`status` with `entry` in its ledger (both kinds keep it under `remediation.history`)."""
    rem: RemediationStatus = getattr(status, "remediation", None) or RemediationStatus()
    history = merge_history(rem.history, [entry])
    return status.model_copy(update={"remediation": rem.model_copy(update={"history": history})})


class StatusJournal(Generic[S]):
    """The object's status as the ledger of intents; `known` follows every write."""

    def __init__(
        self, statuses: StatusCache[S], client: KubeApi, body: Mapping[str, Any], known: Known[S]
    ) -> None:
        meta = body["metadata"]
        self.statuses = statuses
        self.client = client
        self.namespace, self.name, self.uid = (
            str(meta["namespace"]), str(meta["name"]), str(meta["uid"]),
        )  # fmt: skip
        self.base = known
        self.known = known
        self.writes = 0

    async def intend(self, entry: LedgerEntry) -> None:
        """Persist `entry` (Pending); raises `k8s.ApiError` if the API server will not take it,
        and then the action must not run."""
        new = with_entry(self.known.status, entry)
        self.known = await write(
            self.statuses.kind, self.client, self.namespace, self.name, base=self.known, new=new
        )
        self.statuses.remember(self.uid, self.known)
        self.writes += 1

    def final(self, ours: S) -> tuple[Known[S], S]:
        """The base and the status for the cycle's own write: `ours` was computed from the
        status before any intent, so it is re-applied on what the intents left."""
        if self.known is self.base:
            return self.base, ours
        return self.known, self.statuses.kind.rebase(ours, self.base.status, self.known.status)
