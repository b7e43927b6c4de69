"""Defaults: what a user gets for every field they leave out, on the pydantic side."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from pdwarden.api import (
    InvalidSpec,
    PDDeploymentSpec,
    PDDeploymentStatus,
    parse_spec,
    parse_status,
    spec_to_wire,
    status_to_wire,
)


def test_minimal_spec_gets_every_default() -> None:
    spec = parse_spec({"model": {"name": "tiny"}})
    assert spec.engine == "pdworker"
    assert spec.image is None
    assert spec.transfer.backend == "nixl"
    assert spec.transfer.nixl_backend == "UCX"
    assert spec.transfer.bootstrap_port == 8998
    for pool in (spec.prefill, spec.decode):
        assert (pool.replicas, pool.gpus) == (1, 1)
        assert pool.args == [] and pool.env == [] and pool.labels == {}
        assert pool.resources is None and pool.affinity is None
    assert spec.router.replicas == 1
    r = spec.remediation
    assert r.mode == "Enforce" and r.acts
    assert (r.scrape_interval_seconds, r.wedge_after_seconds, r.restart_after_seconds) == (
        5,
        60,
        60,
    )
    assert r.actions == ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests"]
    assert r.max_unavailable_decode == "25%"
    assert (r.max_actions_per_hour, r.cooldown_seconds) == (20, 60)


def test_wire_form_is_camel_case_and_round_trips() -> None:
    spec = parse_spec({"model": {"name": "tiny"}, "remediation": {"mode": "DryRun"}})
    wire = spec_to_wire(spec)
    assert wire["remediation"]["wedgeAfterSeconds"] == 60
    assert wire["transfer"]["nixlBackend"] == "UCX"
    assert "image" not in wire  # unset optionals are left out, as the API server stores them
    assert parse_spec(wire) == spec
    assert not spec.remediation.acts


def test_python_names_are_accepted_too() -> None:
    spec = PDDeploymentSpec(model={"name": "tiny"}, remediation={"wedge_after_seconds": 30})  # type: ignore[arg-type]
    assert spec.remediation.wedge_after_seconds == 30


def test_the_boundary_accepts_wire_names_only() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.remediation\.wedge_after_seconds"):
        parse_spec({"model": {"name": "tiny"}, "remediation": {"wedge_after_seconds": 30}})


def test_spec_is_frozen() -> None:
    spec = parse_spec({"model": {"name": "tiny"}})
    with pytest.raises(ValidationError):
        spec.engine = "sglang"  # type: ignore[misc]


def test_defaults_are_not_shared_between_instances() -> None:
    a = parse_spec({"model": {"name": "a"}})
    b = parse_spec({"model": {"name": "b"}})
    assert a.remediation.actions is not b.remediation.actions
    assert a.prefill.labels is not b.prefill.labels


def test_empty_status_and_full_status_round_trip() -> None:
    assert parse_status(None) == PDDeploymentStatus()
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    raw = {
        "observedGeneration": 3,
        "phase": "Wedged",
        "conditions": [
            {"type": "Wedged", "status": "True", "reason": "InflightStuck",
             "message": "3 rooms", "lastTransitionTime": "2026-01-02T03:04:05Z"},
        ],
        "prefill": {"replicas": 1, "readyReplicas": 1, "summary": "1/1"},
        "decode": {"replicas": 2, "readyReplicas": 1, "cordonedReplicas": 1, "summary": "1/2"},
        "wedgedRooms": 3,
        "wedges": [{"pod": "p-0", "role": "prefill", "reason": "InflightStuck", "rooms": 3,
                    "oldestSeconds": 75.5, "peer": "d-1", "since": "2026-01-02T03:04:05Z"}],
        "remediation": {
            "history": [{"time": "2026-01-02T03:04:05Z", "action": "CordonDecode", "pod": "d-1"}],
            "cordoned": [{"pod": "d-1", "since": "2026-01-02T03:04:05Z"}],
            "actionsLastHour": 1,
        },
    }  # fmt: skip
    status = parse_status(raw)
    assert status.conditions[0].last_transition_time == now
    assert status.decode is not None and status.decode.cordoned_replicas == 1
    wire = status_to_wire(status)
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert parse_status(wire) == status


def test_status_refuses_naive_times_and_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        parse_status({"wedges": [{"pod": "p", "role": "prefill", "reason": "x",
                                  "since": "2026-01-02T03:04:05"}]})  # fmt: skip
    with pytest.raises(ValidationError):
        parse_status({"kopf": {"progress": {}}})
