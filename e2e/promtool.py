"""Prometheus's own promtool over the chart's alerts and dashboard (issue 34).

The chart (helm/pdwarden) promises alerts and a Grafana dashboard over pdwarden's metrics. Tests
do not imitate PromQL: they render the chart with the pinned helm, hand its PrometheusRule groups
to `promtool check rules` and `promtool test rules` (Prometheus 3, built into ~/.cache/pdwarden
by e2e/cluster/build-prometheus.sh: `make prometheus-bin`), and feed promtool what a real
operator served when an alert must fire on it (e2e/tests/test_remediation_scenarios.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "pdwarden"
DASHBOARDS = CHART / "dashboards"
BUILD_SCRIPT = ROOT / "e2e" / "cluster" / "build-prometheus.sh"
# The release the rules are rendered for; PDWardenDown's selector names its namespace and Service.
RELEASE, NAMESPACE = "pdw", "pdw-system"
NAME = re.compile(r"\bpdwarden_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
# What Grafana puts in for $__rate_interval when a panel is drawn; promtool needs a duration.
RATE_INTERVAL = "5m"
# A scraped body is held constant this long before alerts are read: longer than any `for:`.
HOLD_STEPS, HOLD_STEP = 120, "30s"
Rules = dict[str, Any]


class PromtoolMissing(RuntimeError):
    """promtool is not in the cache: the tests say how to build it instead of skipping."""


def family(name: str) -> str:
    """A series or selector name's metric family (a counter's `_total` and so on dropped)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def rules_from_manifests(rendered: str) -> Rules:
    """The rule file (`groups:`) of the one PrometheusRule among rendered manifests."""
    docs = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "PrometheusRule"]
    (rule,) = docs
    return {"groups": rule["spec"]["groups"]}


def render_rules(helm: str, *args: str) -> Rules:
    """The chart's alerting rules as `helm template` renders them (defaults plus `args`)."""
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "-n", NAMESPACE,
         "--set", "metrics.prometheusRule.enabled=true", *args],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return rules_from_manifests(out.stdout)


def alerts(rules: Rules) -> dict[str, dict[str, Any]]:
    """Each alerting rule, by alert name."""
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def panel_exprs() -> dict[str, list[str]]:
    """Each dashboard panel's queries, by "<dashboard file>: <panel title>"."""
    out: dict[str, list[str]] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            key = f"{path.name}: {panel['title']}"
            out[key] = [t.get("expr", "") for t in panel.get("targets", [])]
    return out


def dashboard_rules() -> Rules:
    """Every panel query as a recording rule, so `promtool check rules` parses it as PromQL."""
    exprs = [e for es in panel_exprs().values() for e in es]
    return {
        "groups": [{
            "name": "dashboard-queries",
            "rules": [
                {"record": f"pdwarden_dashboard:query_{i}", "expr": e.replace(
                    "$__rate_interval", RATE_INTERVAL)}
                for i, e in enumerate(exprs)
            ],
        }]
    }  # fmt: skip


def chart_families(rules: Rules) -> set[str]:
    """Every pdwarden metric family the chart's alerts and dashboards read."""
    exprs = [r["expr"] for r in alerts(rules).values()]
    exprs += [e for es in panel_exprs().values() for e in es]
    return {family(n) for e in exprs for n in NAME.findall(e)}


def served_families(exposition: str) -> set[str]:
    """The metric families a /metrics body carries a real observation of: a sample whose value
    is not 0, or a labelled gauge series (code creates one only by setting it, and a gauge may
    read 0 again by the time the body is taken). prometheus-client serves every unlabelled
    counter and histogram, and every series declared up front, at 0 before anything happened,
    so a bare 0 of those proves nothing."""
    return {
        family(s.name)
        for fam in text_string_to_metric_families(exposition)
        for s in fam.samples
        if not s.name.endswith("_created")
        and (s.value != 0 or (fam.type == "gauge" and bool(s.labels)))
    }


def series_notation(name: str, labels: dict[str, str]) -> str:
    """`name{k="v",...}` as promtool's input_series reads it (values quoted and escaped)."""
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def held_series(exposition: str) -> list[dict[str, str]]:
    """A scraped /metrics body as promtool input series, each sample held for HOLD_STEPS."""
    return [
        {"series": series_notation(s.name, dict(s.labels)), "values": f"{s.value!r}x{HOLD_STEPS}"}
        for fam in text_string_to_metric_families(exposition)
        for s in fam.samples
    ]


@dataclass
class Promtool:
    path: str

    @classmethod
    def locate(cls) -> Promtool:
        """The cached promtool (build-prometheus.sh --where); never builds, says how instead."""
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--where"], check=False, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise PromtoolMissing(out.stderr.strip() or "run `make prometheus-bin`")
        return cls(str(Path(out.stdout.strip()) / "promtool"))

    def run(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.path, *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=120
        )

    def check_rules(self, rules: Rules) -> subprocess.CompletedProcess[str]:
        """`promtool check rules` with its linter fatal (duplicate rules fail too)."""
        with tempfile.TemporaryDirectory(prefix="pdwarden-promtool-") as tmp:
            (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
            return self.run(
                "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml", cwd=Path(tmp)
            )

    def test_rules(self, rules: Rules, tests: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """`promtool test rules` of a unit-test file (its `rule_files` replaced by `rules`)."""
        with tempfile.TemporaryDirectory(prefix="pdwarden-promtool-") as tmp:
            (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
            doc = {**tests, "rule_files": ["rules.yaml"]}
            (Path(tmp) / "tests.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            return self.run("test", "rules", "tests.yaml", cwd=Path(tmp))

    def firing_on(
        self, rules: Rules, exposition: str, alert: str, expected: list[dict[str, str]],
        namespace: str,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Whether `alert` fires, in `namespace`, for exactly the `expected` label sets once the
        scraped body has been served unchanged for an hour (longer than any `for:`). Prometheus
        evaluates the rules itself; promtool's ALERTS series is what Alertmanager would get."""
        own = alerts(rules)[alert].get("labels", {})
        want = [
            {"alertname": alert, "alertstate": "firing", **own, **labels} for labels in expected
        ]
        minutes = HOLD_STEPS * int(HOLD_STEP.removesuffix("s")) // 60
        tests = {
            "evaluation_interval": HOLD_STEP,
            "tests": [{
                "interval": HOLD_STEP,
                "input_series": held_series(exposition),
                "promql_expr_test": [{
                    "expr": f'ALERTS{{alertname="{alert}",namespace="{namespace}"}}',
                    "eval_time": f"{minutes}m",
                    "exp_samples": [
                        {"labels": series_notation("ALERTS", w), "value": 1} for w in want
                    ],
                }],
            }],
        }  # fmt: skip
        return self.test_rules(rules, tests)
