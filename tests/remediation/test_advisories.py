"""The configuration advisor's pure half: pods -> advisories -> the Advisories condition.

detect/advisories.py asks each pod's engine for its advisories (the rules are tested per engine
in tests/engines/test_*_advice.py), bounds them, and words the condition; record/ledger.py sets
it on both kinds' statuses. Warnings only: the plan and the findings never see them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pdwarden.api import PDDeploymentStatus, PDRemediationPolicyStatus, RemediationSpec
from pdwarden.engines import ENGINES
from pdwarden.engines.protocol import Advice, AdviceRule
from pdwarden.remediation.decide import Plan
from pdwarden.remediation.detect import advisories as adv
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.record.ledger import cycle_status, mode_off_status
from pdwarden.remediation.record.policy_report import inactive_status

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ENGINES_DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
HUGE_WAIT = {"name": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "value": "100000"}


def sglang_pod(name: str, *env: dict[str, str], mode: str = "decode") -> dict[str, Any]:
    command = ["python3", "-m", "sglang.launch_server", "--disaggregation-mode", mode]
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "s", "command": command, "env": list(env)}]},
    }


def status_with(advice: tuple[adv.PodAdvice, ...]) -> PDDeploymentStatus:
    return cycle_status(
        previous=PDDeploymentStatus(), policy=RemediationSpec(), generation=1,
        detection=Detection(), decision=Plan(), history=[], decodes=[], now=NOW, reset_at=None,
        advisories=advice,
    )  # fmt: skip


def advisories_condition(status: Any) -> Any:
    return next(c for c in status.conditions if c.type == "Advisories")


def test_pods_are_advised_by_their_engine_in_a_stable_order() -> None:
    pods = [sglang_pod("d-1", HUGE_WAIT), sglang_pod("d-0", HUGE_WAIT), sglang_pod("d-2")]
    found = adv.advise(pods, "sglang")
    assert [(a.pod, a.uid, a.advice.rule.name) for a in found] == [
        ("d-0", "uid-d-0", "SGLangWaitingTimeoutHuge"),
        ("d-1", "uid-d-1", "SGLangWaitingTimeoutHuge"),
    ]
    assert adv.advise(pods, "pdworker") == ()  # pdworker has no rules
    assert found[0].key == ("uid-d-0", "SGLangWaitingTimeoutHuge")
    assert found[0].event_id("o") != found[1].event_id("o") != found[1].event_id("p")


def test_a_pod_whose_rules_fail_is_left_out_and_the_rest_advised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = ENGINES["sglang"]
    real = engine.advisories

    def flaky(pod: Any) -> tuple[Advice, ...]:
        if pod["metadata"]["name"] == "d-0":
            raise RuntimeError("a rule with a bug")
        return real(pod)

    monkeypatch.setattr(type(engine), "advisories", lambda self, pod: flaky(pod))
    found = adv.advise([sglang_pod("d-0", HUGE_WAIT), sglang_pod("d-1", HUGE_WAIT)], "sglang")
    assert [a.pod for a in found] == ["d-1"]


def test_advisories_are_bounded() -> None:
    pods = [sglang_pod(f"d-{i:04d}", HUGE_WAIT) for i in range(adv.MAX_ADVISORIES + 50)]
    assert len(adv.advise(pods, "sglang")) == adv.MAX_ADVISORIES


def test_the_condition_lists_a_few_and_counts_the_rest() -> None:
    rule = AdviceRule("SomeRule", "SOME_VARIABLE", "srt/x.py:1", "It can go wrong.")
    many = tuple(adv.PodAdvice(f"p-{i}", f"u-{i}", rule.advise("9" * 500)) for i in range(20))
    found, reason, message = adv.condition(many)
    assert (found, reason) == (True, "RiskySettings")
    assert message.startswith("20 setting(s) on 20 pod(s)")
    assert message.count("SOME_VARIABLE") == adv.MAX_LISTED
    assert message.endswith(f"; and {20 - adv.MAX_LISTED} more")
    assert "9" * adv.MAX_SHOWN_VALUE not in message  # a value is shown cut
    assert len(message) <= adv.MAX_MESSAGE
    assert adv.condition(())[:2] == (False, "NoRiskySettings")


def test_both_kinds_report_the_condition_and_keep_its_time_while_it_lasts() -> None:
    found = adv.advise([sglang_pod("d-0", HUGE_WAIT)], "sglang")
    first = advisories_condition(status_with(found))
    assert (first.status, first.reason) == ("True", "RiskySettings")
    assert "d-0: SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 100000" in first.message
    assert "srt/disaggregation/common/conn.py:" in first.message
    clean = advisories_condition(status_with(()))
    assert (clean.status, clean.reason) == ("False", "NoRiskySettings")
    assert status_with(found).phase == status_with(()).phase  # a warning, never a phase
    # Mode Off reads nothing: Unknown, not a stale True.
    off = mode_off_status(status_with(found), now=NOW, generation=2)
    assert advisories_condition(off).status == "Unknown"
    policy = PDRemediationPolicyStatus()
    assert (
        advisories_condition(inactive_status(policy, invalid=None, now=NOW, generation=1)).status
        == "Unknown"
    )


def test_the_docs_table_lists_every_rule_with_its_first_source() -> None:
    """docs/engines.md, "Configuration advisories": a row per rule, citing its file:line."""
    section = ENGINES_DOC.read_text().split("## Configuration advisories\n")[1].split("\n## ")[0]
    rows = {
        m.group(1): line
        for line in section.splitlines()
        if (m := re.match(r"^\| `(\w+)` \|", line))
    }
    rules = [r for e in ENGINES.values() for r in e.advisory_rules]
    assert sorted(rows) == sorted(r.name for r in rules)
    for rule in rules:
        cited = re.search(r"[\w.]+\.py:\d+(-\d+)?", rule.source)
        assert cited is not None and cited.group() in rows[rule.name], rule.name
