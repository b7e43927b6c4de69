"""Just enough PromQL to judge the chart's alerts against an operator's real /metrics.

The chart (helm/pdwarden) promises alerts and a dashboard over pdwarden's metrics. Tests read
every metric name the chart uses, and evaluate instant-vector alert expressions of the shape
`<max|min|sum> by (<labels>) (<metric>{<matchers>}) <op> <number>` against exposition text
scraped from a running operator; range functions (rate, increase) are only name-checked.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "pdwarden"
RULES = CHART / "templates" / "prometheusrule.yaml"
DASHBOARDS = CHART / "dashboards"
NAME = re.compile(r"\bpdwarden_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
Labels = frozenset[tuple[str, str]]
Series = list[tuple[str, dict[str, str], float]]
AGG: dict[str, Callable[[list[float]], float]] = {"max": max, "min": min, "sum": sum}
CMP: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
INSTANT = re.compile(
    r"^\s*(?P<agg>max|min|sum)\s+by\s*\((?P<by>[^)]*)\)\s*"
    r"\(\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(?P<matchers>[^}]*)\})?\s*\)\s*"
    r"(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>[0-9.]+)\s*$"
)
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=|!=)\s*"([^"]*)"\s*')


def family(name: str) -> str:
    """A series or selector name's metric family (a counter's `_total` and so on dropped)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def rule_exprs() -> dict[str, str]:
    """Each alert's expression in the chart's PrometheusRule template, by alert name."""
    exprs: dict[str, str] = {}
    alert = None
    for line in RULES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- alert:"):
            alert = stripped.removeprefix("- alert:").strip()
        elif stripped.startswith("expr:") and alert is not None:
            exprs[alert] = stripped.removeprefix("expr:").strip()
    return exprs


def panel_exprs() -> dict[str, list[str]]:
    """Each dashboard panel's queries, by "<dashboard file>: <panel title>"."""
    out: dict[str, list[str]] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            key = f"{path.name}: {panel['title']}"
            out[key] = [t.get("expr", "") for t in panel.get("targets", [])]
    return out


def chart_families() -> set[str]:
    """Every pdwarden metric family the chart's alerts and dashboards read."""
    exprs = [*rule_exprs().values(), *(e for es in panel_exprs().values() for e in es)]
    return {family(n) for e in exprs for n in NAME.findall(e)}


def parse(text: str) -> Series:
    return [
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def families(series: Series) -> set[str]:
    return {family(name) for name, _, _ in series}


def evaluate(expr: str, series: Series) -> dict[Labels, float]:
    """The result of an instant-vector alert expression: the label sets it fires for."""
    m = INSTANT.match(expr)
    if m is None:
        raise ValueError(f"not in the supported PromQL subset: {expr}")
    matchers = _matchers(m["matchers"] or "")
    by = [label.strip() for label in m["by"].split(",") if label.strip()]
    groups: dict[Labels, list[float]] = {}
    for name, labels, value in series:
        if name != m["name"]:
            continue
        if not all((labels.get(k, "") == v) == (op == "=") for k, op, v in matchers):
            continue
        key = frozenset((k, labels.get(k, "")) for k in by)
        groups.setdefault(key, []).append(value)
    threshold, cmp = float(m["value"]), CMP[m["op"]]
    agg = AGG[m["agg"]]
    return {k: agg(vs) for k, vs in groups.items() if cmp(agg(vs), threshold)}


def _matchers(text: str) -> list[tuple[str, str, str]]:
    out = []
    for part in filter(str.strip, text.split(",")):
        m = MATCHER.fullmatch(part)
        if m is None:
            raise ValueError(f"not a label matcher: {part}")
        out.append((m[1], m[2], m[3]))
    return out
