"""A policy's selection status: pod counts, refusals, Conflict and CordonUnavailable; and the
status of a policy that runs no cycles (mode Off, an invalid spec). Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pdwarden.api import (
    PDRemediationPolicySpec,
    PDRemediationPolicyStatus,
    parse_policy_spec,
    parse_policy_status,
    to_wire,
)
from pdwarden.constants import LABEL_SERVING
from pdwarden.remediation.policy.cordon import cordon_check
from pdwarden.remediation.policy.scope import ForeignPod, foreign_pod, select
from pdwarden.remediation.record.policy_report import inactive_status, selection_status

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = parse_policy_spec({
    "engine": "sglang", "metrics": {"port": 30000},
    "prefillSelector": {"matchLabels": {"app": "sg", "role": "prefill"}},
    "decodeSelector": {"matchLabels": {"app": "sg", "role": "decode"}},
    "cordon": {"serviceRef": {"name": "sg-decode"}},
})  # fmt: skip
RIVAL = parse_policy_spec({
    "engine": "sglang", "metrics": {"port": 30000},
    "prefillSelector": {"matchLabels": {"nothing": "here"}},
    "decodeSelector": {"matchLabels": {"shared": "yes"}},
})  # fmt: skip


def pod(name: str, ready: bool = True, /, **labels: str) -> ForeignPod:
    return foreign_pod({
        "metadata": {"name": name, "uid": f"u-{name}", "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })  # fmt: skip


PODS = [
    pod("p0", app="sg", role="prefill"),
    pod("d0", app="sg", role="decode", **{LABEL_SERVING: "false"}),
    pod("d1", False, app="sg", role="decode"),
    pod("d2", app="sg", role="decode", shared="yes"),
]


def status(
    policies: dict[str, PDRemediationPolicySpec],
    selector: dict[str, str] | None,
    previous: PDRemediationPolicyStatus,
    now: datetime,
) -> PDRemediationPolicyStatus:
    scope = select("mine", SPEC, policies, PODS)
    check = cordon_check(SPEC.cordon, selector, scope.decode)
    return selection_status(SPEC, scope, check, previous, now=now, generation=3)


def test_counts_refusals_and_conditions() -> None:
    got = status({"mine": SPEC, "rival": RIVAL}, {"app": "sg"}, PDRemediationPolicyStatus(), T0)
    assert got.prefill is not None and got.decode is not None
    assert (got.prefill.matched, got.prefill.eligible, got.prefill.ready) == (1, 1, 1)
    assert (got.decode.matched, got.decode.eligible, got.decode.ready, got.decode.cordoned) == (
        3, 2, 2, 1)  # fmt: skip
    assert got.decode.selector == "app=sg,role=decode"
    assert [(r.pod, r.reason, r.policies) for r in got.refused] == [
        ("d2", "SelectedByAnotherPolicy", ["rival"])]  # fmt: skip
    by_type = {c.type: c for c in got.conditions}
    assert by_type["Conflict"].status == "True" and "rival" in by_type["Conflict"].message
    assert by_type["CordonUnavailable"].status == "True"
    assert by_type["CordonUnavailable"].reason == "SelectorMissingLabel"
    assert got.observed_generation == 3
    assert parse_policy_status(to_wire(got)) == got  # what the loop will write is valid status


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = status({"rival": RIVAL}, {"app": "sg"}, PDRemediationPolicyStatus(), T0)
    later = T0 + timedelta(minutes=1)
    same = status({"rival": RIVAL}, {"app": "sg"}, first, later)
    assert same.conditions == first.conditions
    fixed = status({}, {"app": "sg", LABEL_SERVING: "true"}, same, later)
    by_type = {c.type: c for c in fixed.conditions}
    assert (by_type["Conflict"].status, by_type["Conflict"].last_transition_time) == (
        "False", later)  # fmt: skip
    assert (by_type["CordonUnavailable"].status, by_type["CordonUnavailable"].reason) == (
        "False", "SelectorIncludesLabel")  # fmt: skip
    assert fixed.refused == []


def test_other_status_fields_are_left_to_the_remediation_pass() -> None:
    previous = parse_policy_status({
        "wedgedRooms": 4,
        "conditions": [{"type": "Wedged", "status": "True", "reason": "InflightStuck",
                        "lastTransitionTime": "2026-11-30T11:00:00Z"}],
        "remediation": {"actionsLastHour": 2},
    })  # fmt: skip
    got = status({}, None, previous, T0)
    assert got.wedged_rooms == 4 and got.remediation == previous.remediation
    assert any(c.type == "Wedged" and c.status == "True" for c in got.conditions)
    assert {c.type for c in got.conditions} == {"Wedged", "Conflict", "CordonUnavailable"}
    assert next(c for c in got.conditions if c.type == "CordonUnavailable").reason == (
        "ServiceNotFound"
    )


def test_an_inactive_policy_says_why_and_stays_put() -> None:
    before = status({}, {"app": "sg"}, PDRemediationPolicyStatus(), T0)
    off = inactive_status(before, invalid=None, now=T0, generation=4)
    by_type = {c.type: c for c in off.conditions}
    assert (by_type["RemediationSuspended"].status, by_type["RemediationSuspended"].reason) == (
        "True", "ModeOff")  # fmt: skip
    assert by_type["Ready"].status == "False" and by_type["Wedged"].status == "Unknown"
    assert "Degraded" not in by_type and off.observed_generation == 4
    assert off.prefill == before.prefill  # the last counts stay, for `kubectl get pdrp`
    assert inactive_status(off, invalid=None, now=T0 + timedelta(minutes=5), generation=4) == off
    bad = inactive_status(before, invalid="invalid spec: engine: bad", now=T0, generation=5)
    degraded = next(c for c in bad.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason, degraded.message) == (
        "True", "InvalidSpec", "invalid spec: engine: bad")  # fmt: skip
    assert parse_policy_status(to_wire(bad)) == bad
