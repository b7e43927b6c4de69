"""The chart's PDRemediationPolicy switch and RBAC (templates/rbac-policies.yaml), no cluster."""

from __future__ import annotations

from typing import Any

from .chart_helpers import CHART, Helm, find, operator_args


def policy_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for o in objs
        if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"].endswith("-policies")
        for r in o["rules"]
    ]


def grants(rules: list[dict[str, Any]], resource: str) -> set[str]:
    return {v for r in rules if resource in r["resources"] for v in r["verbs"]}


def test_policies_on_by_default_with_the_minimum_rbac(helm: Helm) -> None:
    objs = helm.objects()
    assert "--no-policies" not in operator_args(objs)
    rules = policy_rules(objs)
    assert grants(rules, "pods") == {"get", "list", "watch", "patch"}
    assert grants(rules, "pods/eviction") == {"create"}
    assert grants(rules, "services") == {"get"}
    assert grants(rules, "events") == {"create"}
    assert grants(rules, "pdremediationpolicies/status") == {"patch"}
    assert grants(rules, "secrets") == set()  # no Secret named: none readable
    assert all("delete" not in r["verbs"] for r in rules)


def test_policies_off_drops_the_watch_and_the_rbac(helm: Helm) -> None:
    objs = helm.objects("--set", "policies.enabled=false")
    assert "--no-policies" in operator_args(objs)
    assert policy_rules(objs) == []


def test_admin_token_secrets_are_readable_by_name_only(helm: Helm) -> None:
    objs = helm.objects("--set", "watchNamespaces={team-a},policies.adminTokenSecrets={sgl-admin}")
    (role,) = [r for r in find(objs, "Role") if r["metadata"]["name"].endswith("-policies")]
    assert role["metadata"]["namespace"] == "team-a"
    (secret_rule,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secret_rule == {
        "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["sgl-admin"],
        "verbs": ["get"],
    }  # fmt: skip


def test_policy_rbac_rules_carry_a_comment_naming_their_code() -> None:
    lines = (CHART / "templates" / "rbac-policies.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("- apiGroups:"):
            assert lines[i - 1].startswith("#"), line
