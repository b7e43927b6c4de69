"""Label cordon and eviction for foreign pods: preconditions and outcomes (pure, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pdwarden.api import CordonSpec, HeldBack, LedgerEntry, parse_policy_spec
from pdwarden.constants import LABEL_SERVING
from pdwarden.k8s.foreign import eviction_outcome
from pdwarden.remediation.act.pod_label import label_patch
from pdwarden.remediation.act.restart import eviction_done
from pdwarden.remediation.decide import PlannedAction, actions_in_last_hour
from pdwarden.remediation.policy.cordon import cordon_check
from pdwarden.remediation.policy.scope import ForeignPod, foreign_pod
from pdwarden.remediation.record.ledger import ledger_entry
from pdwarden.values import EvictionOutcome


def record_eviction(
    action: PlannedAction, outcome: EvictionOutcome, now: datetime
) -> tuple[LedgerEntry, HeldBack | None]:
    """The ledger entry and held-back note a restart by eviction leaves (as the cycle writes)."""
    done = eviction_done(action, outcome, now)
    entry = ledger_entry(
        action, now=now, dry_run=False, outcome=done.outcome, detail=done.detail, rooms=done.rooms
    )
    return entry, done.held


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KEY = LABEL_SERVING


def cordon(**raw: object) -> CordonSpec:
    return CordonSpec.model_validate(raw, by_alias=True)


def pod(name: str, uid: str = "", /, **labels: str) -> ForeignPod:
    return foreign_pod({"metadata": {"name": name, "uid": uid or f"uid-{name}",
                                     "resourceVersion": "7", "labels": labels}})  # fmt: skip


WITH_SERVICE = {"serviceRef": {"name": "decode"}}


@pytest.mark.parametrize(
    ("raw", "selector", "unavailable", "reason"),
    [
        ({}, None, None, "NoServiceToCheck"),
        (WITH_SERVICE, None, True, "ServiceNotFound"),
        (WITH_SERVICE, {"app": "sg"}, True, "SelectorMissingLabel"),
        (WITH_SERVICE, {"app": "sg", KEY: "false"}, True, "SelectorValueMismatch"),
        (WITH_SERVICE, {"app": "sg", KEY: "true"}, False, "SelectorIncludesLabel"),
        ({**WITH_SERVICE, "labelKey": "example.com/live", "servingValue": "yes",
          "cordonedValue": "no"}, {"example.com/live": "yes"}, False, "SelectorIncludesLabel"),
        ({**WITH_SERVICE, "labelKey": "example.com/live"}, {KEY: "true"}, True,
         "SelectorMissingLabel"),
    ],
)  # fmt: skip
def test_cordon_check(
    raw: dict[str, object], selector: dict[str, str] | None, unavailable: bool | None, reason: str
) -> None:
    check = cordon_check(cordon(**raw), selector)
    assert (check.unavailable, check.reason) == (unavailable, reason)
    assert check.allows_cordon is (unavailable is not True)
    assert check.message


def test_missing_label_message_tells_what_to_add() -> None:
    check = cordon_check(cordon(**WITH_SERVICE), {"app": "sg"})
    assert 'pdwarden.dev/serving: "true"' in check.message
    assert "selector" in check.message and "template" in check.message


def test_cordon_check_names_decode_pods_without_the_label() -> None:
    pods = (pod("d0", **{KEY: "true"}), pod("d1", **{KEY: "false"}), pod("d2"))
    check = cordon_check(cordon(**WITH_SERVICE), {KEY: "true"}, pods)
    assert check.unavailable is False
    assert "1 decode pod(s) lack the label" in check.message and "d2" in check.message
    assert "d0" not in check.message and "d1" not in check.message


def test_cordon_sets_the_cordoned_value_and_uncordon_sets_serving_back() -> None:
    spec = cordon()
    serving = pod("d0", **{KEY: "true"})
    cut = label_patch(PlannedAction("CordonDecode", "d0", "stalled", uid="uid-d0"), serving, spec)
    assert cut is not None
    assert (cut.pod, cut.uid, cut.resource_version, cut.key, cut.value) == (
        "d0", "uid-d0", "7", KEY, "false")  # fmt: skip
    cordoned = pod("d0", **{KEY: "false"})
    back = label_patch(
        PlannedAction("UncordonDecode", "d0", "healthy", uid="uid-d0"), cordoned, spec
    )
    assert back is not None and back.value == "true"  # set back, never removed


def test_no_patch_when_already_so_or_for_another_incarnation_or_other_actions() -> None:
    spec = cordon()
    cordoned = pod("d0", **{KEY: "false"})
    assert (
        label_patch(PlannedAction("CordonDecode", "d0", "x", uid="uid-d0"), cordoned, spec) is None
    )
    newer = pod("d0", "uid-new", **{KEY: "true"})
    assert label_patch(PlannedAction("CordonDecode", "d0", "x", uid="uid-d0"), newer, spec) is None
    assert label_patch(PlannedAction("RestartDecode", "d0", "x", uid="uid-d0"), newer, spec) is None


@pytest.mark.parametrize(
    ("status", "message", "result"),
    [
        (201, "", "Evicted"),
        (200, "", "Evicted"),
        (429, "Cannot evict pod as it would violate the pod's disruption budget.", "HeldBack"),
        (404, 'pods "d0" not found', "Gone"),
        (409, "Precondition failed: UID in precondition: a, UID in object meta: b", "Gone"),
        (500, "This pod has more than one PodDisruptionBudget, which the eviction subresource "
              "does not support.", "HeldBack"),
        (500, "etcdserver: request timed out", "Failed"),
        (403, "forbidden", "Failed"),
        (0, "timeout", "Failed"),
    ],
)  # fmt: skip
def test_eviction_outcome(status: int, message: str, result: str) -> None:
    outcome = eviction_outcome(status, message)
    assert outcome.result == result
    if result == "HeldBack":
        assert outcome.reason.startswith("PodDisruptionBudget: ") and message in outcome.reason


def test_held_back_eviction_is_recorded_but_never_trips_the_breaker() -> None:
    spec = parse_policy_spec({
        "engine": "sglang", "metrics": {"port": 1},
        "prefillSelector": {"matchLabels": {"r": "p"}},
        "decodeSelector": {"matchLabels": {"r": "d"}},
        "remediation": {"mode": "Enforce", "maxActionsPerHour": 2},
    })  # fmt: skip
    action = PlannedAction("RestartDecode", "d0", "cordoned 60s ago and still stalled", uid="u")
    pdb = eviction_outcome(429, "Cannot evict pod as it would violate the pod's disruption budget.")
    history: list[LedgerEntry] = []
    for _ in range(5):
        entry, held = record_eviction(action, pdb, NOW)
        history.append(entry)
        assert held is not None and held.pod == "d0" and "disruption budget" in held.reason
        assert entry.outcome == "Skipped" and "disruption budget" in entry.reason
    used = actions_in_last_hour(history, NOW, dry_run=False, reset_at=None)
    assert used == 0 < spec.remediation.max_actions_per_hour
    done, held = record_eviction(action, eviction_outcome(201, ""), NOW)
    assert (done.outcome, held) == ("Succeeded", None)
    assert actions_in_last_hour([*history, done], NOW, dry_run=False, reset_at=None) == 1
    failed, _ = record_eviction(action, eviction_outcome(500, "boom"), NOW)
    assert failed.outcome == "Failed" and failed.reason.endswith("boom")
