"""Cross-field rules and bad input, on the pydantic side: the same refusals the CRD makes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdwarden.api import InvalidSpec, RemediationSpec, parse_spec
from pdwarden.api.base import ApiModel
from pdwarden.api.crd import build_crd, build_policy_crd
from pdwarden.api.parse import parse_policy_spec

from .cases import BAD_SPECS, BASE_SPEC, Bad, merged
from .policy_cases import BASE_POLICY


def test_base_spec_is_valid() -> None:
    parse_spec(BASE_SPEC)


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_spec_is_refused_naming_the_field(case: Bad) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(case.spec)
    assert any(p.startswith(case.field) for p in refused.value.problems), refused.value.problems


def test_restart_prefill_stands_alone_only_on_vllm() -> None:
    """SGLang restarts a prefill only after an abort did not drain it (the refusal is in
    BAD_SPECS and BAD_POLICIES); vLLM has no abort an operator can call, so there RestartPrefill
    is the first and only rung (remediation/decide/rungs.py, restart_read_peer)."""
    remediation = {"actions": ["CordonDecode", "RestartPrefill"]}
    deployment = merged(BASE_SPEC, {"engine": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                     "remediation": remediation})  # fmt: skip
    assert parse_spec(deployment).remediation.actions == ["CordonDecode", "RestartPrefill"]
    policy = merged(BASE_POLICY, {"engine": "vllm", "remediation": remediation})
    assert parse_policy_spec(policy).remediation.actions == ["CordonDecode", "RestartPrefill"]
    with pytest.raises(InvalidSpec, match="RestartPrefill needs AbortRequests unless"):
        parse_policy_spec(merged(policy, {"engine": "sglang"}))


def test_the_table_is_big_and_distinct() -> None:
    assert len(BAD_SPECS) >= 15
    assert len({c.id for c in BAD_SPECS}) == len(BAD_SPECS)


def _all_models(cls: type[ApiModel]) -> set[type[ApiModel]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _all_models(sub)
    return found


def _crd_rules() -> list[dict[str, str]]:
    rules: list[dict[str, str]] = []

    def walk(node: dict[str, object]) -> None:
        rules.extend(node.get("x-kubernetes-validations", []))  # type: ignore[arg-type]
        for key in ("properties",):
            for sub in (node.get(key) or {}).values():  # type: ignore[attr-defined]
                walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])  # type: ignore[arg-type]

    for crd in (build_crd(), build_policy_crd()):
        walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return rules


def test_every_python_rule_is_in_the_crd_with_the_same_message() -> None:
    crd_rules = {(r["rule"], r["message"]) for r in _crd_rules()}
    python_rules = {(r.cel, r.message) for m in _all_models(ApiModel) for r in m.RULES}
    assert python_rules, "no rules found"
    assert python_rules == crd_rules


@pytest.mark.parametrize(
    ("remediation", "ok"),
    [
        ({"scrapeIntervalSeconds": 5, "wedgeAfterSeconds": 6}, True),
        ({"scrapeIntervalSeconds": 5, "restartAfterSeconds": 5}, True),
        ({"actions": []}, True),
        ({"actions": ["CordonDecode"]}, True),
        ({"actions": ["FailRooms"]}, True),
        ({"maxUnavailableDecode": "0%"}, True),
        ({"maxUnavailableDecode": "99%"}, True),
        ({"maxUnavailableDecode": 0}, True),
        ({"maxUnavailableDecode": 3}, True),
        ({"maxUnavailableDecode": "5"}, False),
        ({"maxUnavailableDecode": "05%"}, True),
        ({"maxUnavailableDecode": "250%"}, False),
        ({"maxUnavailableDecode": 513}, False),
    ],
)
def test_remediation_boundaries(remediation: dict[str, object], ok: bool) -> None:
    spec = merged(BASE_SPEC, {"remediation": remediation})
    if ok:
        parse_spec(spec)
    else:
        with pytest.raises(InvalidSpec, match=r"spec\.remediation\.maxUnavailableDecode"):
            parse_spec(spec)


@pytest.mark.parametrize(
    ("patch", "ok"),
    [
        ({"decode": {"replicas": 0}, "remediation": {"mode": "Off"}}, True),
        ({"decode": {"replicas": 0}, "remediation": {"mode": "DryRun"}}, True),
        ({"decode": {"replicas": 0}, "remediation": {"actions": ["FailRooms", "CordonDecode"]}},
         True),
        ({"decode": {"replicas": 0}}, False),
        ({"engine": "sglang", "image": "x", "prefill": {"gpus": 1}, "decode": {"gpus": 1}}, True),
        ({"engine": "sglang", "image": "x", "prefill": {"gpus": 1}}, False),
        ({"prefill": {"labels": {"app": "x", "team.example/pdwarden.dev": "y"}}}, True),
        ({"router": {"annotations": {"pdwarden.dev/template-hash": "x"}}}, False),
        ({"router": {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}}, True),
        ({"prefill": {"resources": {"requests": {"nvidia.com/gpu": 1}}}}, False),
        ({"prefill": {"env": [{"name": "A", "valueFrom": {}}]}}, False),
        ({"prefill": {"env": [{"name": "A", "valueFrom": {
            "secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "x"}}}]}}, False),
        ({"prefill": {"affinity": {"nodeAffinity": {"anything": ["goes", 1]}}}}, True),
        ({"prefill": {"priorityClassName": "Not_A_Name"}}, False),
    ],
)  # fmt: skip
def test_cross_field_intent(patch: dict[str, object], ok: bool) -> None:
    spec = merged(BASE_SPEC, patch)
    if ok:
        parse_spec(spec)
    else:
        with pytest.raises(InvalidSpec):
            parse_spec(spec)


@given(
    scrape=st.integers(1, 300),
    wedge=st.integers(2, 86400),
    restart=st.integers(1, 86400),
)
def test_timing_rules_match_their_statement(scrape: int, wedge: int, restart: int) -> None:
    raw = {"scrapeIntervalSeconds": scrape, "wedgeAfterSeconds": wedge,
           "restartAfterSeconds": restart}  # fmt: skip
    expected = wedge > scrape and restart >= scrape
    try:
        RemediationSpec.model_validate(raw)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == expected


@given(st.one_of(st.integers(-5, 600), st.text(max_size=5)))
def test_budget_rule_matches_its_statement(budget: int | str) -> None:
    if isinstance(budget, int):
        expected = 0 <= budget <= 512
    else:
        expected = (
            budget.endswith("%")
            and 2 <= len(budget) <= 3
            and all(c in "0123456789" for c in budget[:-1])
        )
    try:
        RemediationSpec.model_validate({"maxUnavailableDecode": budget})
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == expected
