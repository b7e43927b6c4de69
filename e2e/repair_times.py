"""Time to repair per scenario, as the real-engine tiers measure it, handed to `bench.repair`.

Why a module: the tiers print what they measure for a reader of the CI log; the bench needs the
same figures as data. With PDWARDEN_REPAIR_TIMES naming a file, each scenario appends one JSON
line to it (engine, scenario, the first repairing action and the seconds from the fault to it
and to the pair serving again); without it nothing is written.
"""

from __future__ import annotations

import json
import os
from typing import Final

ENV: Final = "PDWARDEN_REPAIR_TIMES"


def record(engine: str, scenario: str, **figures: float | str | None) -> None:
    """Append one scenario's figures (seconds rounded to 0.1 s) to the file named by ENV."""
    path = os.environ.get(ENV)
    if not path:
        return
    rounded = {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}
    line = json.dumps({"engine": engine, "scenario": scenario, **rounded}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
