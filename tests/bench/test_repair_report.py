"""bench.repair's report: the scenarios the engine tiers recorded, beside what the engine does
alone, and the goal judged from them (the scenarios themselves run in `make test`, on the real
engines; `make bench-repair` runs them for the figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e.repair_times import ENV, record

from bench import repair

PREFILL = "frozen prefill, a KV read in flight"
DECODE = "frozen decode behind its live API server"
KILLED = "decode engine killed"
IDLE = "idle pool, frozen prefill (no read in flight)"
SG_PREFILL = "frozen prefill scheduler, requests arriving"
SG_DECODE = "frozen decode scheduler, requests arriving"
SG_IDLE = "idle pool, frozen prefill scheduler"
SG_KILLED = "decode killed (every process)"


def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    path = tmp_path / "times.jsonl"
    monkeypatch.setenv(ENV, str(path))
    record("vllm", PREFILL, action="RestartPrefill", action_seconds=18.04, serving_seconds=95.0)
    record("vllm", DECODE, action="CordonDecode", action_seconds=16.0, restart_seconds=81.0,
           serving_seconds=160.0)  # fmt: skip
    record("vllm", KILLED, action=None, action_seconds=None, serving_seconds=40.0)
    record("vllm", IDLE, action="RestartPrefill", action_seconds=16.0, serving_seconds=70.0)
    record("sglang", SG_PREFILL, action="RestartPrefill", action_seconds=19.0,
           serving_seconds=80.0)  # fmt: skip
    record("sglang", SG_DECODE, action="CordonDecode", action_seconds=18.0,
           restart_seconds=80.0, serving_seconds=190.0)  # fmt: skip
    record("sglang", SG_IDLE, action="RestartPrefill", action_seconds=17.0, serving_seconds=75.0)
    record("sglang", SG_KILLED, action=None, action_seconds=None, serving_seconds=65.0)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_without_the_variable_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record("vllm", PREFILL, action="RestartPrefill", action_seconds=1.0, serving_seconds=2.0)
    assert list(tmp_path.iterdir()) == []


def test_every_scenario_sits_beside_what_the_engine_does_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = repair.report(recorded(tmp_path, monkeypatch))
    rows = {r["scenario"]: r for r in data["scenarios"]}
    assert set(rows) == {PREFILL, DECODE, KILLED, IDLE, SG_PREFILL, SG_DECODE, SG_IDLE, SG_KILLED}
    assert data["missing"] == []
    assert rows[SG_DECODE]["engine_alone_repairs"] and "liveness probe" in rows[SG_DECODE][
        "engine_alone"]  # fmt: skip
    assert rows[PREFILL]["action_seconds"] == 18.0  # recorded to a tenth of a second
    assert not rows[DECODE]["engine_alone_repairs"] and "never" in rows[DECODE]["engine_alone"]
    assert rows[KILLED]["goal_met"] and rows[KILLED]["action"] is None  # nothing to repair
    assert data["goal_met"] and data["settings"]["canary_deadline_seconds"] == 4
    text = repair.summary(data)
    assert "CordonDecode 16 s (restart 81 s)" in text and "goal met: True" in text


def test_a_slow_repair_or_a_scenario_that_recorded_nothing_misses_the_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = recorded(tmp_path, monkeypatch)
    slow = [dict(r, action_seconds=21.0) if r["scenario"] == IDLE else r for r in records]
    assert not repair.report(slow)["goal_met"]
    without = [r for r in records if r["scenario"] != DECODE]
    data = repair.report(without)
    assert not data["goal_met"] and data["missing"] == [f"vllm: {DECODE}"]
    assert "MISSING: vllm: " + DECODE in repair.summary(data)


def test_the_scenarios_it_runs_exist_and_record_under_the_names_it_reads() -> None:
    sources = ""
    for test in repair.TESTS:
        path, name = test.split("::")
        sources += (repair.ROOT / path).read_text()
        assert f"def {name}(" in sources, test
    for engine, scenario in repair.ENGINE_ALONE:
        assert f'record("{engine}", "{scenario}"' in sources, scenario


def test_the_picture_is_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    repair.plot(repair.report(recorded(tmp_path, monkeypatch)), tmp_path / "repair.png")
    assert (tmp_path / "repair.png").stat().st_size > 1000
