"""Names other code depends on are written once: grep-checked here.

Why a test: a port, label or metric name typed as a literal in a second place drifts the day
the first one changes, and nothing fails until a cluster does. The worker's HTTP port and its
`pdworker_*` metric names are defined by the worker's contract (`pdworker.contract`; the port is
re-exported for the operator as `pdwarden.constants.WORKER_PORT`); label keys, annotations and
the apiVersion (everything under the `pdwarden.dev/` prefix) by `pdwarden.constants`. Every other
Python file imports them. Docstrings and comments may name them: prose does not drift into a
cluster.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml

from pdwarden.constants import GROUP, WORKER_PORT
from pdworker import contract as pdw

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("operator", "worker", "e2e", "tests", "bench")
DEFINED_IN = {Path("worker/pdworker/contract.py")}
NOT_YET: set[Path] = set()  # files still retyping names (none: keep it that way)
# Where the operator's API group prefix may not be typed: the e2e and bench harnesses (the
# operator writes its own in constants.py; tests/ asserts on rendered objects by design).
GROUP_CHECKED = ("e2e", "bench")
TOKEN = re.compile(r"pdworker_[a-z0-9_]+")


def _files(tops: Iterable[str]) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel not in DEFINED_IN and ".venv" not in rel.parts:
                yield rel


def _literal(port: int) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){port}(?![\w.])")


def _strings(source: str) -> Iterator[tuple[int, str]]:
    """Each string literal of a module (f-strings' literal parts too) but its docstrings."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


def _metric_names() -> set[str]:
    """Every series name the worker's contract defines, as a scrape shows it: a counter with and
    without `_total`, a histogram's `_count`, `_sum` and `_bucket`."""
    names = set()
    for key, value in vars(pdw).items():
        if key.isupper() and isinstance(value, str) and value.startswith("pdworker_"):
            base = value.removesuffix("_total")
            names |= {value, base, *(base + part for part in ("_count", "_sum", "_bucket"))}
    return names


def _retyped(source: str, metrics: set[str], group: bool) -> list[tuple[int, str]]:
    found = []
    for line, text in _strings(source):
        metric = any(token in metrics for token in TOKEN.findall(text))
        if metric or (group and f"{GROUP}/" in text):
            found.append((line, text))
    return found


def test_the_worker_port_is_written_once_in_python() -> None:
    pattern = _literal(WORKER_PORT)
    offenders = []
    for rel in _files(SOURCES):
        for number, line in enumerate((ROOT / rel).read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == [], "import WORKER_PORT instead:\n" + "\n".join(offenders)


def test_metric_names_labels_and_api_version_are_written_once() -> None:
    metrics = _metric_names()
    assert pdw.PREFILL_INFLIGHT_QUEUE in metrics and f"{pdw.KV_TRANSFER_SECONDS}_count" in metrics
    offenders = []
    for rel in _files(SOURCES):
        if rel in NOT_YET:
            continue
        group = rel.parts[0] in GROUP_CHECKED
        for line, text in _retyped((ROOT / rel).read_text(), metrics, group):
            offenders.append(f"{rel}:{line}: {text[:100]!r}")
    assert offenders == [], (
        "import the name (pdworker.contract for pdworker_* metrics, pdwarden.constants for "
        "labels and apiVersion) instead:\n" + "\n".join(offenders)
    )


def test_the_check_sees_a_retyped_name_but_not_prose() -> None:
    running, seconds = pdw.DECODE_RUNNING, pdw.KV_TRANSFER_SECONDS
    source = (  # written from the names, so that this file retypes none of them
        f'"""Reads {running}."""\n'
        f"# and {seconds}_sum\n"
        f'RUNNING = "{running}"\n'
        f'SUM = f"{{x}}{seconds}_sum {{y}}"\n'
        f"LABELS = {{'{GROUP}/role': 'prefill'}}\n"
        f'API = ("{GROUP}/v1", "pdworker_e2e", "{running[:20]}")\n'
    )
    found = _retyped(source, _metric_names(), group=True)
    assert [line for line, _ in found] == [3, 4, 5, 6]
    assert [line for line, _ in _retyped(source, _metric_names(), group=False)] == [3, 4]


def test_the_chart_default_is_the_same_port() -> None:
    values = yaml.safe_load((ROOT / "helm/pdwarden/values.yaml").read_text())
    assert values["networkPolicy"]["workerPort"] == WORKER_PORT
