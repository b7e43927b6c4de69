"""The chart's alerts and dashboard read only metrics the operator declares (issue 23).

Reads the rules helm renders and the dashboard files. Whether each metric is also served by a
running operator is checked after the remediation e2e (e2e/tests/test_remediation_scenarios.py,
last test), where promtool evaluates the suspended alert over a real operator's /metrics; how
the alerts behave is unit-tested by promtool itself (test_chart_alerts.py).
"""

from __future__ import annotations

import json

import pytest
from e2e import promtool
from prometheus_client.metrics import MetricWrapperBase

from pdwarden import metrics

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


def test_every_metric_the_alerts_and_dashboard_read_is_declared(helm: Helm) -> None:
    rules = promtool.rules_from_manifests(
        helm.template("--set", "metrics.prometheusRule.enabled=true")
    )
    used = promtool.chart_families(rules)
    assert {"pdwarden_remediation_suspended", "pdwarden_wedged_rooms"} <= used
    assert not used - declared(), sorted(used - declared())


@pytest.mark.parametrize("panel", sorted(promtool.panel_exprs()))
def test_each_dashboard_panel_queries_an_existing_metric(panel: str) -> None:
    exprs = promtool.panel_exprs()[panel]
    assert exprs and all(exprs), f"{panel}: a panel without a query"
    for expr in exprs:
        names = {promtool.family(n) for n in promtool.NAME.findall(expr)}
        assert names, f"{panel}: {expr} reads no pdwarden metric"
        assert names <= declared(), f"{panel}: {sorted(names - declared())} are not declared"


def test_the_dashboard_has_the_promised_panels() -> None:
    titles = {key.split(": ", 1)[1] for key in promtool.panel_exprs()}
    assert set(PROMISED_PANELS) <= titles


def test_the_dashboard_is_valid_grafana_json() -> None:
    for path in promtool.DASHBOARDS.glob("*.json"):
        doc = json.loads(path.read_text())
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)) and doc["uid"] and doc["title"]


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar(helm: Helm) -> None:
    assert not find(helm.objects(), "ConfigMap")  # optional: off by default
    objs = helm.objects("--set", "metrics.dashboard.enabled=true")
    (cm,) = find(objs, "ConfigMap", "pdw-pdwarden-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["pdwarden.json"])
    assert shipped == json.loads((promtool.DASHBOARDS / "pdwarden.json").read_text())
