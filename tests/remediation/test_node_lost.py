"""Which pods count as on a lost node: the node lifecycle controller's mark (Ready False, its
containers ready, no gate holding it), never a kubelet's own verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pdwarden.constants import CONDITION_SERVING
from pdwarden.remediation.node_lost import GATE_SETTLE_SECONDS, lost_pods, node_lost

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
GATED = [{"conditionType": CONDITION_SERVING}]


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def pod(
    ready: str,
    containers: str,
    *,
    reason: str | None = None,
    gate: str | None = None,
    gate_since: float = 600.0,
    gates: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    conds: list[dict[str, Any]] = [
        {"type": "ContainersReady", "status": containers, "lastTransitionTime": at(900)},
        {"type": "Ready", "status": ready, "lastTransitionTime": at(40),
         **({"reason": reason} if reason else {})},
    ]  # fmt: skip
    if gate is not None:
        conds.append({"type": CONDITION_SERVING, "status": gate,
                      "lastTransitionTime": at(gate_since)})  # fmt: skip
    return {
        "metadata": {"name": "pd-decode-1"},
        "spec": {"nodeName": "gpu-node-3", "readinessGates": gates if gates is not None else []},
        "status": {"phase": "Running", "conditions": conds},
    }


def test_the_node_controllers_mark_is_a_lost_node() -> None:
    why = node_lost(pod("False", "True", gate="True", gates=GATED), NOW)
    assert why is not None and why.startswith("gpu-node-3 stopped reporting")
    assert node_lost(pod("False", "True"), NOW) is not None  # no gates at all
    assert lost_pods([pod("False", "True")], NOW) == {
        "pd-decode-1": node_lost(pod("False", "True"), NOW)
    }


@pytest.mark.parametrize(
    ("case", "p"),
    [
        ("ready", pod("True", "True", gate="True", gates=GATED)),
        ("a container is not ready: the kubelet's verdict",
         pod("False", "False", reason="ContainersNotReady")),
        ("pdwarden's cordon holds it", pod("False", "True", reason="ReadinessGatesNotReady",
                                           gate="False", gates=GATED)),
        ("a gate opened a moment ago, the kubelet has not recomputed Ready yet",
         pod("False", "True", reason="ReadinessGatesNotReady", gate="True", gates=GATED,
             gate_since=GATE_SETTLE_SECONDS - 5)),
        ("a gate's condition not written yet", pod("False", "True", gates=GATED)),
        ("no conditions at all", {"metadata": {"name": "x"}, "status": {}}),
    ],
)  # fmt: skip
def test_a_pod_its_kubelet_speaks_for_is_not_lost(case: str, p: dict[str, Any]) -> None:
    assert node_lost(p, NOW) is None, case


def test_a_gate_reason_that_outlived_the_gate_opening_is_a_lost_node() -> None:
    """Lost while cordoned, then uncordoned: no kubelet is left to make the pod Ready."""
    p = pod("False", "True", reason="ReadinessGatesNotReady", gate="True", gates=GATED,
            gate_since=GATE_SETTLE_SECONDS + 5)  # fmt: skip
    assert node_lost(p, NOW) is not None
    p["status"]["conditions"][-1]["lastTransitionTime"] = "garbage"
    assert node_lost(p, NOW) is None  # unreadable: the kubelet is given the benefit
