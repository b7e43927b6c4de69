"""Names other code depends on are written once: the worker port is a grep-checked example.

Why a test: a port, label or metric name typed as a literal in a second place drifts the day
the first one changes, and nothing fails until a cluster does. The worker's HTTP port is defined
by the worker's contract (`pdworker.contract.DEFAULT_HTTP_PORT`), re-exported for the operator
as `pdwarden.constants.WORKER_PORT`; every other Python file imports it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pdwarden.constants import WORKER_PORT

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("operator", "worker", "e2e", "tests", "bench")
DEFINED_IN = {Path("worker/pdworker/contract.py")}


def _literal(port: int) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){port}(?![\w.])")


def test_the_worker_port_is_written_once_in_python() -> None:
    pattern = _literal(WORKER_PORT)
    offenders = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in DEFINED_IN or ".venv" in rel.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == [], "import WORKER_PORT instead:\n" + "\n".join(offenders)


def test_the_chart_default_is_the_same_port() -> None:
    values = yaml.safe_load((ROOT / "helm/pdwarden/values.yaml").read_text())
    assert values["networkPolicy"]["workerPort"] == WORKER_PORT
