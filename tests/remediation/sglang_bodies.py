"""Time series of SGLang /metrics bodies in SGLang's real exposition format, for detection tests.

Each body starts from a fixture that data/make_sglang_fixtures.py wrote with prometheus-client in
multiprocess mode and sglang 0.5.23's names and labels (two DP ranks, priority scheduling); only
numbers are changed. A value is put on DP rank 0 (every TP copy, the priority="" total and
priority "0"); DP rank 1 and priority "1" read 0, so the parser must pick the right series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench._metrics_sim import sglang_body

from pdwarden.remediation.scrape.samples import parse_metrics
from pdwarden.values import Sample

# The rendering lives with the bench's SGLang metrics player, so both play the same series.
body = sglang_body


Knob = float | list[float] | Callable[[int], float]


def series(
    role: str, n: int, step: float = 5.0, start: float = 1000.0, **knobs: Knob
) -> tuple[Sample, ...]:
    """n parsed samples `step` seconds apart; a knob is a constant, a list, or f(i)."""
    out = []
    for i in range(n):
        values: dict[str, Any] = {
            k: (v[i] if isinstance(v, list) else v(i) if callable(v) else v)
            for k, v in knobs.items()
        }
        out.append(parse_metrics(body(role, **values), start + i * step, engine="sglang"))
    return tuple(out)
