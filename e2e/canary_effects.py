"""What one pair canary adds to a real pair's counters, read the way the operator reads them.

Why: detection subtracts what pdwarden's own canaries add to a pod's counters (each engine's
`PAIR_CANARY.effects`), so a frozen pod plus canaries is still a frozen pod. Both engine tiers hold
that table to their real pair the same way: one canary sent with pdwarden's own sender, every
counter of both pods scraped before and after, in a moment when the operator sent none of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from pdwarden.engines import COUNTER_FIELDS
from pdwarden.remediation.confirm.pair_canary import PairCanarySender
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import PairCanary, PairResult, Target

Counters = list[dict[str, float]]  # per target, Sample counter -> value
TRIES = 6
LANDED_SECONDS = 10.0


async def _counters(client: WorkerClient, targets: Sequence[Target]) -> Counters:
    out = []
    for res in await client.scrape(targets, None):
        assert res.sample is not None, res.error
        out.append({f: float(v) for f in COUNTER_FIELDS
                    if (v := getattr(res.sample, f)) is not None})  # fmt: skip
    return out


async def _one(
    targets: Sequence[Target], canary: PairCanary, deadline: float,
    landed: Callable[[Counters, Counters], bool],
) -> tuple[Counters, PairResult, Counters]:  # fmt: skip
    client = WorkerClient()
    try:
        before = await _counters(client, targets)
        prefill, decode = targets
        res = await PairCanarySender(client, client).pair(
            prefill, decode, canary, deadline=deadline
        )
        after = await _counters(client, targets)
        for _ in range(int(LANDED_SECONDS / 0.5)):  # an engine may publish a moment later
            if landed(before, after):
                break
            await asyncio.sleep(0.5)
            after = await _counters(client, targets)
        return before, res, after
    finally:
        await client.close()


def measured(
    targets: Sequence[Target], canary: PairCanary, deadline: float,
    operator_canaries: Callable[[], float],
    landed: Callable[[Counters, Counters], bool] = lambda before, after: True,
) -> tuple[PairResult, dict[str, dict[str, float]]]:  # fmt: skip
    """The last canary's result and, by role, each counter it moved and by how much ({} when
    every try had one of the operator's canaries in between). `targets` is (prefill, decode);
    `operator_canaries()` reads the operator's pdwarden_pair_canaries_total; `landed(before,
    after)` says when an engine that publishes late has shown the canary."""
    deltas: dict[str, dict[str, float]] = {}
    res: PairResult | None = None
    for _ in range(TRIES):
        theirs = operator_canaries()
        before, res, after = asyncio.run(_one(targets, canary, deadline, landed))
        if res.outcome != "decoded":
            break
        if operator_canaries() == theirs:
            deltas = {t.role: {f: v - b.get(f, 0.0) for f, v in a.items() if v != b.get(f)}
                      for t, b, a in zip(targets, before, after, strict=True)}  # fmt: skip
            break
    assert res is not None
    return res, deltas
