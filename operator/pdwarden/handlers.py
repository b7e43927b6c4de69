"""What the kopf handlers do, as plain async functions (registration lives in main.py).

Why separate: these functions can be imported and called without a kopf registry; they turn
reconcile results into kopf's retry vocabulary and serialize passes per object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from pdwarden import metrics
from pdwarden.k8s import KubeClient
from pdwarden.reconcile import PassResult, TransientError, reconcile

log = logging.getLogger("pdwarden.handlers")
RETRY_DELAY = 5.0


@dataclass
class OperatorState:
    """Process-wide state kept in kopf's memo: the API client and one lock per object."""

    client: KubeClient
    token_key: bytes | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())


async def reconcile_now(
    state: OperatorState, body: Mapping[str, Any], force_apply: bool
) -> PassResult:
    uid = body["metadata"]["uid"]
    first_time = uid not in state.known
    async with state.lock_for(uid):
        try:
            result = await reconcile(
                state.client, body, force_apply=force_apply or first_time, token_key=state.token_key
            )
        except TransientError as e:
            raise kopf.TemporaryError(f"API server error, retrying: {e}", delay=RETRY_DELAY) from e
    state.known.add(uid)
    metrics.MANAGED.set(len(state.known))
    return result


def forget(state: OperatorState, body: Mapping[str, Any]) -> None:
    uid = body["metadata"]["uid"]
    state.known.discard(uid)
    state.locks.pop(uid, None)
    metrics.MANAGED.set(len(state.known))
