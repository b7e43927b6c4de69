"""`pdwarden status` on a PDRemediationPolicy: selected pods, refusals, held-back actions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pdwarden.cli.commands import _kind_and_name
from pdwarden.cli.status_view import format_status

NOW = datetime(2026, 11, 30, 23, 0, 0, tzinfo=UTC)

POLICY = {
    "apiVersion": "pdwarden.dev/v1alpha1",
    "kind": "PDRemediationPolicy",
    "metadata": {"name": "sgl", "namespace": "serving", "generation": 2},
    "spec": {"engine": "sglang", "remediation": {"mode": "Enforce"}},
    "status": {
        "observedGeneration": 2,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "PodsSelected", "message": "ok",
             "lastTransitionTime": "2026-11-30T22:50:00Z"},
            {"type": "Conflict", "status": "True", "reason": "PodsSelectedTwice",
             "message": "1 pod(s) (sgl-prefill-1) are also selected by other",
             "lastTransitionTime": "2026-11-30T22:55:00Z"},
        ],
        "prefill": {"matched": 2, "eligible": 1, "ready": 2, "selector": "role=prefill"},
        "decode": {"matched": 3, "eligible": 3, "ready": 3, "cordoned": 1,
                   "selector": "role=decode"},
        "refused": [{"pod": "sgl-prefill-1", "reason": "SelectedByAnotherPolicy",
                     "policies": ["other"]}],
        "heldBack": [{"time": "2026-11-30T22:59:30Z", "action": "RestartDecode",
                      "pod": "sgl-decode-1", "reason": "PodDisruptionBudget: Cannot evict"}],
        "remediation": {"history": [], "actionsLastHour": 1},
    },
}  # fmt: skip


def test_policy_view_shows_pods_refusals_and_held_back() -> None:
    text = format_status(POLICY, now=NOW)
    assert text.startswith("PDRemediationPolicy serving/sgl   ready True   engine sglang")
    assert "remediation Enforce" in text
    lines = text.splitlines()
    decode = next(line for line in lines if line.startswith("decode"))
    assert decode.split()[:5] == ["decode", "3", "3", "3", "1"]
    assert any("sgl-prefill-1" in line and "other" in line for line in lines)
    held = next(line for line in lines if "sgl-decode-1" in line and "RestartDecode" in line)
    assert "30s" in held and "PodDisruptionBudget" in held
    assert "kubectl annotate pdrp" in text or "reset" not in text


def test_policy_without_status_says_so() -> None:
    obj = {**POLICY, "status": {}}
    assert "not reconciled this PDRemediationPolicy" in format_status(obj, now=NOW)


@pytest.mark.parametrize(
    ("raw", "kind", "want"),
    [
        ("pd", None, (None, "pd")),
        ("pdrp/sgl", None, ("PDRemediationPolicy", "sgl")),
        ("PDD/pd", None, ("PDDeployment", "pd")),
        ("sgl", "pdremediationpolicy", ("PDRemediationPolicy", "sgl")),
    ],
)
def test_status_takes_kind_slash_name(
    raw: str, kind: str | None, want: tuple[str | None, str]
) -> None:
    assert _kind_and_name(raw, kind) == want
