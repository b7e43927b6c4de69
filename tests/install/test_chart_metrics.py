"""The chart's alerts and dashboard read only metrics the operator declares (issue 23).

Pure: reads helm/pdwarden as files. Whether each of them is also served by a running operator
is checked after the remediation e2e (e2e/tests/test_remediation_scenarios.py, last test); the
suspended alert is evaluated there against a real operator's /metrics.
"""

from __future__ import annotations

import json

import pytest
from e2e import promql
from prometheus_client.metrics import MetricWrapperBase

from pdwarden import metrics
from pdwarden.constants import KIND

from .chart_helpers import Helm, find

PROMISED_PANELS = (
    "Wedged rooms",
    "Actions by kind and outcome",
    "Time to remediate",
    "Remediation suspended (circuit breaker)",
    "Scrape errors and refused bodies",
    "Cycle duration",
)


def declared() -> set[str]:
    """The metric families pdwarden.metrics defines."""
    wrappers = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    return {family.name for m in wrappers for family in m.describe()}


def test_every_metric_the_alerts_and_dashboard_read_is_declared() -> None:
    used = promql.chart_families()
    assert {"pdwarden_remediation_suspended", "pdwarden_wedged_rooms"} <= used
    assert not used - declared(), sorted(used - declared())


@pytest.mark.parametrize("panel", sorted(promql.panel_exprs()))
def test_each_dashboard_panel_queries_an_existing_metric(panel: str) -> None:
    exprs = promql.panel_exprs()[panel]
    assert exprs and all(exprs), f"{panel}: a panel without a query"
    for expr in exprs:
        names = {promql.family(n) for n in promql.NAME.findall(expr)}
        assert names, f"{panel}: {expr} reads no pdwarden metric"
        assert names <= declared(), f"{panel}: {sorted(names - declared())} are not declared"


def test_the_dashboard_has_the_promised_panels() -> None:
    titles = {key.split(": ", 1)[1] for key in promql.panel_exprs()}
    assert set(PROMISED_PANELS) <= titles


def test_the_suspended_alert_fires_per_object_and_not_when_closed() -> None:
    expr = promql.rule_exprs()["PDWardenRemediationSuspended"]
    body = "\n".join([
        "# TYPE pdwarden_remediation_suspended gauge",
        f'pdwarden_remediation_suspended{{kind="{KIND}",namespace="a",name="pd"}} 1.0',
        'pdwarden_remediation_suspended{kind="PDRemediationPolicy",namespace="a",name="pd"} 0.0',
        f'pdwarden_remediation_suspended{{kind="{KIND}",namespace="b",name="pd"}} 0.0',
    ]) + "\n"  # fmt: skip
    fired = promql.evaluate(expr, promql.parse(body))
    assert list(fired) == [frozenset({("kind", KIND), ("namespace", "a"), ("name", "pd")})]


def test_the_dashboard_is_valid_grafana_json() -> None:
    for path in promql.DASHBOARDS.glob("*.json"):
        doc = json.loads(path.read_text())
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)) and doc["uid"] and doc["title"]


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar(helm: Helm) -> None:
    assert not find(helm.objects(), "ConfigMap")  # optional: off by default
    objs = helm.objects("--set", "metrics.dashboard.enabled=true")
    (cm,) = find(objs, "ConfigMap", "pdw-pdwarden-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["pdwarden.json"])
    assert shipped == json.loads((promql.DASHBOARDS / "pdwarden.json").read_text())
