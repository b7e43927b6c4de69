"""PDRemediationPolicy API, pydantic side: examples, defaults, refusals, selectors, the CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden import constants
from pdwarden.api import (
    InvalidSpec,
    LabelSelector,
    PDRemediationPolicySpec,
    PolicyRemediationSpec,
    RemediationSpec,
    build_crd,
    build_policy_crd,
    parse_policy_spec,
    parse_policy_status,
    parse_spec,
    render_policy_crd_yaml,
    to_wire,
)
from pdwarden.api.crd import CRD_FILES
from pdwarden.api.schema import structural_schema
from pdwarden.cli import main

from . import structural
from .cases import BASE_SPEC, CRD_FILE, POLICY_CRD_FILE, load_policy_examples
from .policy_cases import BAD_POLICIES, BASE_POLICY, BadPolicy

EXAMPLES = load_policy_examples()


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# --- examples and defaults ---------------------------------------------------------------------


def test_both_policy_examples_exist_and_parse() -> None:
    assert set(EXAMPLES) == {"policy-sglang-statefulset.yaml", "policy-lws.yaml"}
    for doc in EXAMPLES.values():
        assert doc["apiVersion"] == constants.API_VERSION
        assert doc["kind"] == constants.POLICY_KIND
        spec = parse_policy_spec(doc["spec"])
        assert spec.remediation.mode == "DryRun"
        assert spec.cordon.service_ref is not None


def test_lws_example_selects_group_leaders_of_each_role() -> None:
    """On the labels LWS's pod webhook sets, as e2e/tests/test_policy_lws.py runs them."""
    spec = parse_policy_spec(EXAMPLES["policy-lws.yaml"]["spec"])
    name, index = "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/worker-index"
    for sel in (spec.prefill_selector, spec.decode_selector):
        assert set(sel.match_labels) == {name, index} and sel.match_labels[index] == "0"
    leader = {index: "0", "leaderworkerset.sigs.k8s.io/group-index": "1"}
    assert spec.prefill_selector.matches({**leader, name: "llama-prefill"})
    assert spec.decode_selector.matches({**leader, name: "llama-decode"})
    assert not spec.decode_selector.matches({**leader, name: "llama-prefill"})
    assert not spec.decode_selector.matches({name: "llama-decode", index: "1"})


def test_a_new_policy_is_dry_run_while_a_pddeployment_enforces() -> None:
    policy = parse_policy_spec(BASE_POLICY)
    assert policy.remediation.mode == "DryRun"
    assert not policy.remediation.acts
    assert parse_spec(BASE_SPEC).remediation.mode == "Enforce"


def test_policy_remediation_is_the_shared_model_with_only_the_mode_default_changed() -> None:
    assert issubclass(PolicyRemediationSpec, RemediationSpec)
    assert PolicyRemediationSpec.RULES is RemediationSpec.RULES
    shared, policy = RemediationSpec.model_fields, PolicyRemediationSpec.model_fields
    assert set(shared) == set(policy)
    for name in shared:
        if name != "mode":
            assert repr(policy[name]) == repr(shared[name]), name
    assert (shared["mode"].default, policy["mode"].default) == ("Enforce", "DryRun")
    # Every other default is the PDDeployment's.
    a = to_wire(RemediationSpec())
    b = to_wire(PolicyRemediationSpec())
    assert {k: v for k, v in a.items() if k != "mode"} == {
        k: v for k, v in b.items() if k != "mode"
    }


def test_defaults_fill_cordon_and_metrics() -> None:
    spec = parse_policy_spec(BASE_POLICY)
    assert (spec.cordon.label_key, spec.cordon.serving_value, spec.cordon.cordoned_value) == (
        "pdwarden.dev/serving",
        "true",
        "false",
    )
    assert (spec.metrics.path, spec.metrics.scheme) == ("/metrics", "http")
    assert spec.admin_token_secret_ref is None


def test_enforce_is_a_spec_edit_away() -> None:
    raw = {**BASE_POLICY, "remediation": {"mode": "Enforce"}}
    assert parse_policy_spec(raw).remediation.acts


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD_POLICIES, ids=lambda c: c.id)
def test_bad_policy_is_refused_naming_the_field(case: BadPolicy) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_policy_spec(case.spec)
    assert any(p.startswith(case.field) for p in refused.value.problems), refused.value.problems


def test_the_table_is_big_and_distinct() -> None:
    assert len(BAD_POLICIES) >= 20
    assert len({c.id for c in BAD_POLICIES}) == len(BAD_POLICIES)


def test_label_keys_of_match_labels_are_checked_by_the_operator() -> None:
    raw = {**BASE_POLICY, "decodeSelector": {"matchLabels": {"bad key": "x"}}}
    with pytest.raises(InvalidSpec, match=r"spec\.decodeSelector\.matchLabels: .*not a label key"):
        parse_policy_spec(raw)
    long_name = {"example.com/" + "n" * 64: "x"}
    with pytest.raises(InvalidSpec, match="at most 63"):
        parse_policy_spec({**BASE_POLICY, "decodeSelector": {"matchLabels": long_name}})


# --- selectors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchLabels": {"a": "1"}}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
         {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
         {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchLabels": {"a": "1"},
          "matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"},
          "matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]},
         {"a": "1", "b": "x"}, False),
    ],
)  # fmt: skip
def test_selector_matches_like_the_api_server(
    selector: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is selected


def test_selector_query_string() -> None:
    sel = LabelSelector.model_validate({
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [
            {"key": "c", "operator": "In", "values": ["y", "x"]},
            {"key": "d", "operator": "NotIn", "values": ["z"]},
            {"key": "e", "operator": "Exists"},
            {"key": "f", "operator": "DoesNotExist"},
        ],
    })  # fmt: skip
    assert sel.to_query() == "a=1,b=2,c in (x,y),d notin (z),e,!f"


# --- CRD ---------------------------------------------------------------------------------------


def test_policy_crd_file_is_the_generated_one() -> None:
    assert POLICY_CRD_FILE.read_text() == render_policy_crd_yaml(), "run `make crd`"


def test_pdwarden_crd_prints_both_and_each_kind(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["crd", "--kind", "PDRemediationPolicy"]) == 0
    assert capsys.readouterr().out == POLICY_CRD_FILE.read_text()
    assert main(["crd"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["spec"]["names"]["kind"] for d in docs] == ["PDDeployment", "PDRemediationPolicy"]
    assert main(["crd", "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(CRD_FILES)
    assert (tmp_path / CRD_FILE.name).read_text() == CRD_FILE.read_text()
    assert (tmp_path / POLICY_CRD_FILE.name).read_text() == POLICY_CRD_FILE.read_text()
    assert main(["crd", "--out-dir", str(tmp_path / "missing")]) == 2


def test_policy_crd_identity() -> None:
    crd = build_policy_crd()
    assert crd["metadata"]["name"] == "pdremediationpolicies.pdwarden.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("pdwarden.dev", "Namespaced")
    names = spec["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "PDRemediationPolicy",
        "pdremediationpolicies",
        ["pdrp"],
    )
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_policy_schema_is_structural_and_described() -> None:
    schema = _schema()
    assert structural.problems(schema) == []
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path != ".metadata" and not node.get("description"):
            missing.append(path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if "items" in node and "properties" in node["items"]:
            for name, sub in node["items"]["properties"].items():
                walk(sub, f"{path}[].{name}")

    walk(schema, "")
    assert missing == []
    assert structural_schema(PDRemediationPolicySpec)["required"] == [
        "engine",
        "prefillSelector",
        "decodeSelector",
        "metrics",
    ]


def test_policy_mode_defaults_to_dry_run_in_the_crd_too() -> None:
    rem = _schema()["properties"]["spec"]["properties"]["remediation"]
    assert rem["default"]["mode"] == "DryRun"
    assert rem["properties"]["mode"]["default"] == "DryRun"
    assert rem["properties"]["mode"]["description"].endswith("Default: DryRun.")
    # The same CEL rules as the PDDeployment's remediation, word for word.
    pdd = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert (
        rem["x-kubernetes-validations"]
        == (pdd["properties"]["remediation"]["x-kubernetes-validations"])
    )
    assert pdd["properties"]["remediation"]["default"]["mode"] == "Enforce"


def test_printer_columns_show_health_at_a_glance() -> None:
    columns = build_policy_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    by_name = {c["name"]: c for c in columns if c.get("priority", 0) == 0}
    assert list(by_name) == ["Mode", "Engine", "Prefill", "Decode", "Wedged", "Actions/h", "Age"]
    status = _schema()["properties"]["status"]
    for column in columns:
        path = column["jsonPath"].split(".")[1:]
        if path[0] != "status":
            continue
        node = status
        for part in path[1:]:
            node = node["properties"][part]
        assert node["type"] == column["type"], column


def test_status_round_trips_and_reuses_the_pddeployment_shapes() -> None:
    raw: dict[str, Any] = {
        "observedGeneration": 2,
        "conditions": [
            {"type": "Conflict", "status": "True", "reason": "PodsSelectedTwice",
             "message": "decode-0 is also selected by policy other",
             "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "CordonUnavailable", "status": "True", "reason": "SelectorMissingLabel",
             "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "Wedged", "status": "False", "reason": "NoWedges",
             "lastTransitionTime": "2026-01-02T03:04:05Z"},
        ],
        "prefill": {"matched": 1, "eligible": 1, "ready": 1, "selector": "role=prefill"},
        "decode": {"matched": 3, "eligible": 2, "ready": 3, "cordoned": 0},
        "refused": [{"pod": "decode-0", "reason": "SelectedByAnotherPolicy",
                     "policies": ["other"]}],
        "heldBack": [{"time": "2026-01-02T03:04:05Z", "action": "RestartDecode",
                      "pod": "decode-1", "reason": "PodDisruptionBudget decode-pdb"}],
        "wedgedRooms": 0,
        "remediation": {"history": [{"time": "2026-01-02T03:04:05Z", "action": "CordonDecode",
                                     "pod": "decode-1", "dryRun": True}],
                        "actionsLastHour": 1},
    }  # fmt: skip
    status = parse_policy_status(raw)
    assert parse_policy_status(to_wire(status)) == status
    with pytest.raises(ValueError, match="type"):
        parse_policy_status({"conditions": [{**raw["conditions"][0], "type": "Happy"}]})
