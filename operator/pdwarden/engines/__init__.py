"""Every engine pdwarden runs or watches, one module each, and the one registry of them.

Why: the renderer, the scrape parser, detection, the plan and the confirm stage differ per engine
only in what `Engine` (engines/protocol.py) asks; they call `get(spec.engine)` and never branch on
an engine's name (tests/test_engine_branches.py greps for such branches). Adding an engine is a
module here implementing `Engine`, one entry in `ENGINES`, its name in `api.spec.Engine`, and its
fixtures for the contract suite (tests/engines/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pdwarden.engines import pdworker, sglang, vllm
from pdwarden.engines.protocol import COUNTER_FIELDS, Engine, MetricTable, Series, combine

ENGINES: Final[Mapping[str, Engine]] = {
    e.name: e for e in (pdworker.ENGINE, sglang.ENGINE, vllm.ENGINE)
}
# Every metric table at once, for callers that do not know the engine (each body has one's names).
ANY_METRICS: Final = MetricTable(
    "any", tuple(s for e in ENGINES.values() for s in e.metrics.series)
)

__all__ = ["ANY_METRICS", "COUNTER_FIELDS", "ENGINES", "Engine", "MetricTable", "Series", "combine",
           "get", "metrics"]  # fmt: skip


def get(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; known: {sorted(ENGINES)}") from None


def metrics(name: str | None) -> MetricTable:
    """The metric table of engine `name`; every table at once when the engine is not known."""
    return ANY_METRICS if name is None else get(name).metrics
