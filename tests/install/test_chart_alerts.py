"""The chart's alerts and dashboard queries, judged by Prometheus itself (issue 34).

`promtool check rules` parses and lints the rules `helm template` renders and every dashboard
query; `promtool test rules` runs tests/install/promtool/alerts_test.yaml over those rules: per
alert, a series that fires it and a near miss that stays silent. A rule broken on purpose (a
threshold, a matcher, a `for:`) must fail those tests, or they would not notice a broken alert.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e import promtool as pt
from e2e.promtool import Promtool, Rules
from prometheus_client import generate_latest

from pdwarden import metrics
from pdwarden.constants import KIND

from .chart_helpers import Helm, find

TESTS = Path(__file__).parent / "promtool" / "alerts_test.yaml"
ALERTS = (
    "PDWardenRemediationSuspended",
    "PDWardenWedgePersists",
    "PDWardenKVReadAfterExpiry",
    "PDWardenDisaggregationOff",
    "PDWardenRemediationFailing",
    "PDWardenReconcileErrors",
    "PDWardenOperatorErrors",
    "PDWardenDown",
)
# (alert, field, text in the rendered field, its replacement; None drops the field). Each breaks
# the alert while leaving it valid PromQL, so only the unit tests can notice.
BREAKAGES: list[tuple[str, str, str, str | None]] = [
    ("PDWardenRemediationSuspended", "expr", "> 0", ">= 0"),  # a closed breaker alerts
    ("PDWardenRemediationSuspended", "expr", "> 0", "> 1"),  # an open one never does
    ("PDWardenRemediationSuspended", "expr", "max by (kind, namespace, name)", "max"),
    ("PDWardenRemediationSuspended", "for", "1m", None),
    ("PDWardenWedgePersists", "expr", "> 0", ">= 0"),
    ("PDWardenWedgePersists", "expr", "> 0", "> 1"),
    ("PDWardenWedgePersists", "for", "15m", None),
    ("PDWardenKVReadAfterExpiry", "expr", "> 0", ">= 0"),
    ("PDWardenKVReadAfterExpiry", "expr", "> 0", "> 5"),
    ("PDWardenKVReadAfterExpiry", "expr", '{reason="LateNotification"}', ""),
    ("PDWardenKVReadAfterExpiry", "expr", "[15m]", "[1h]"),
    ("PDWardenDisaggregationOff", "expr", "> 0", ">= 0"),
    ("PDWardenDisaggregationOff", "expr", '{reason="PromptsRecomputed"}', ""),
    ("PDWardenDisaggregationOff", "expr", "[1h]", "[5m]"),
    ("PDWardenRemediationFailing", "expr", "> 0", ">= 0"),
    ("PDWardenRemediationFailing", "expr", '{result="failed"}', ""),
    ("PDWardenRemediationFailing", "for", "5m", None),
    ("PDWardenReconcileErrors", "expr", "> 0", ">= 0"),
    ("PDWardenReconcileErrors", "expr", '{result="error"}', ""),
    ("PDWardenReconcileErrors", "for", "15m", None),
    ("PDWardenOperatorErrors", "expr", "> 0", ">= 0"),
    ("PDWardenOperatorErrors", "expr", '{stage!="scrape"}', ""),
    ("PDWardenOperatorErrors", "for", "15m", None),
    ("PDWardenDown", "expr", "== 1", "== 0"),
    ("PDWardenDown", "expr", 'namespace="pdw-system", ', ""),
    ("PDWardenDown", "for", "5m", None),
]


@pytest.fixture(scope="module")
def rules(helm: Helm) -> Rules:
    return pt.rules_from_manifests(helm.template("--set", "metrics.prometheusRule.enabled=true"))


@pytest.fixture(scope="module")
def unit_tests() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(TESTS.read_text())
    return doc


def failure(out: Any) -> str:
    return f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"


def test_promtool_checks_the_rendered_rules(promtool: Promtool, rules: Rules) -> None:
    assert set(pt.alerts(rules)) == set(ALERTS)
    out = promtool.check_rules(rules)
    assert out.returncode == 0, failure(out)
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout


def test_the_alerts_pass_their_promtool_unit_tests(
    promtool: Promtool, rules: Rules, unit_tests: dict[str, Any]
) -> None:
    out = promtool.test_rules(rules, unit_tests)
    assert out.returncode == 0, failure(out)
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_case_and_a_near_miss(unit_tests: dict[str, Any]) -> None:
    cases = [c for t in unit_tests["tests"] for c in t.get("alert_rule_test", [])]
    for alert in ALERTS:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{alert}: no near miss"


def broken(rules: Rules, alert: str, field: str, old: str, new: str | None) -> Rules:
    out = copy.deepcopy(rules)
    rule = pt.alerts(out)[alert]
    if new is None:
        assert rule.pop(field) == old
    else:
        assert rule[field].count(old) == 1, rule[field]
        rule[field] = rule[field].replace(old, new)
    return out


def breakage_id(b: tuple[str, str, str, str | None]) -> str:
    alert, field, old, new = b
    return f"{alert}:{field}:{old}->{new}"


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[breakage_id(b) for b in BREAKAGES])
def test_promtool_fails_a_broken_alert(
    promtool: Promtool,
    rules: Rules,
    unit_tests: dict[str, Any],
    breakage: tuple[str, str, str, str | None],
) -> None:
    alert, field, old, new = breakage
    bad = broken(rules, alert, field, old, new)
    assert promtool.check_rules(bad).returncode == 0, "still valid: only the unit tests can tell"
    out = promtool.test_rules(bad, unit_tests)
    assert out.returncode != 0, f"{alert} broken ({field}: {old!r} -> {new!r}) passed its tests"
    assert f"alertname: {alert}," in out.stdout + out.stderr, failure(out)


def test_every_alert_is_broken_at_least_once() -> None:
    assert {b[0] for b in BREAKAGES} == set(ALERTS)


def test_promtool_checks_every_dashboard_query(promtool: Promtool) -> None:
    queries = pt.dashboard_rules()
    n = len(queries["groups"][0]["rules"])
    assert n == sum(len(es) for es in pt.panel_exprs().values()) > 0
    out = promtool.check_rules(queries)
    assert out.returncode == 0, failure(out)
    assert f"SUCCESS: {n} rules found" in out.stdout
    # And it would say so for a query that is not PromQL.
    queries["groups"][0]["rules"][0]["expr"] += ")"
    assert promtool.check_rules(queries).returncode != 0


def test_the_servicemonitor_keeps_the_metrics_own_namespace_label(helm: Helm) -> None:
    """The alerts group by the PDDeployment's namespace (pdwarden_remediation_suspended's own
    label), as the unit tests' series carry it: without honorLabels Prometheus would rename it
    exported_namespace and put the operator's namespace in its place."""
    objs = helm.objects(
        "--set", "metrics.service.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"
    )
    (sm,) = find(objs, "ServiceMonitor")
    assert [e.get("honorLabels") for e in sm["spec"]["endpoints"]] == [True]


def test_a_held_operator_scrape_fires_the_suspended_alert_for_the_tripped_object(
    promtool: Promtool, rules: Rules
) -> None:
    """Promtool.firing_on, as the breaker e2e uses it on a live operator, over this process's
    own /metrics body (every pdwarden family, counters' _created samples included)."""
    tripped = {"kind": KIND, "namespace": "promtool-a", "name": "pd"}
    closed = {"kind": KIND, "namespace": "promtool-b", "name": "pd"}
    metrics.REMEDIATION_SUSPENDED.labels(**tripped).set(1)
    metrics.REMEDIATION_SUSPENDED.labels(**closed).set(0)
    try:
        body = generate_latest().decode()
    finally:
        for labels in (tripped, closed):
            metrics.REMEDIATION_SUSPENDED.remove(*labels.values())
    alert = "PDWardenRemediationSuspended"
    out = promtool.firing_on(rules, body, alert, [tripped], "promtool-a")
    assert out.returncode == 0, failure(out)
    out = promtool.firing_on(rules, body, alert, [], "promtool-b")
    assert out.returncode == 0, failure(out)
    # It can fail: the closed breaker's object is not among what fires.
    assert promtool.firing_on(rules, body, alert, [closed], "promtool-b").returncode != 0


def test_a_metric_counts_as_seen_only_when_it_was_really_observed() -> None:
    """The e2e's "every metric the chart reads appeared" reads this: prometheus-client serves
    declared counters and histograms at 0, which proves no code path ever moved them."""
    body = (
        "# TYPE pdwarden_a counter\npdwarden_a_total 0.0\n"
        "# TYPE pdwarden_b counter\npdwarden_b_total 3.0\n"
        '# TYPE pdwarden_c histogram\npdwarden_c_bucket{le="+Inf"} 0.0\npdwarden_c_count 0.0\n'
        "pdwarden_c_sum 0.0\n"
        '# TYPE pdwarden_d histogram\npdwarden_d_bucket{le="+Inf"} 2.0\npdwarden_d_count 2.0\n'
        "pdwarden_d_sum 7.5\n"
        "# TYPE pdwarden_e gauge\npdwarden_e 0.0\n"
        '# TYPE pdwarden_f gauge\npdwarden_f{kind="x"} 0.0\n'
    )
    # f: a labelled gauge series exists only once code set it (to 0 again by now, say).
    assert pt.served_families(body) == {"pdwarden_b", "pdwarden_d", "pdwarden_f"}
