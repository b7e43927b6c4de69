"""Every benchmark's quick mode runs and writes sane results, so the benchmark code cannot rot.

The quick runs start together (each is its own process with its own loopback workers) to
keep the wall time low on two cores; the tests then check each one's JSON and PNG. Nothing here
asserts a timing: only that the numbers exist, are finite and positive, and that invariants the
benchmarks exist to show hold (no leaked rooms after the abort storm).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.nixl]
ROOT = Path(__file__).resolve().parents[2]
NAMES = ("kv_transfer", "kv_storm", "request_path", "abort_storm", "recovery", "operator_scale")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    got: dict[str, Any] = {}
    # The others run side by side; `recovery` runs alone afterwards: it times the operator's
    # detection with a 1 s scrape and a 2 s window, which five other benchmarks saturating two
    # cores can turn into findings about a healthy long prefill (once in CI, 3 findings, 0
    # actions; not reproduced in three parallel reruns).
    for group in ([n for n in NAMES if n != "recovery"], ["recovery"]):
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", f"bench.{name}", "--quick", "--out", str(out)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name in group
        }
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=300)
            path = out / f"{name}-quick.json"
            got[name] = {
                "rc": proc.returncode,
                "output": output[-3000:],
                "data": json.loads(path.read_text()) if path.exists() else None,
                "png": (out / f"{name}-quick.png").stat().st_size if path.exists() else 0,
            }
    return got


def ok(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def check(results: dict[str, Any], name: str) -> dict[str, Any]:
    r = results[name]
    assert r["rc"] == 0, r["output"]
    data = r["data"]
    assert data and data["benchmark"] == name and data["mode"] == "quick", r["output"]
    assert r["png"] > 1000
    assert data["summary"] and data["date"] and data["machine"]
    return data


def test_kv_transfer(results: dict[str, Any]) -> None:
    data = check(results, "kv_transfer")
    assert data["sizes_mib"] == [1, 4]
    methods = ("pdworker_e2e", "pdworker_transport", "raw_nixl[default]", "memcpy",
               "raw_nixl_beside_forward")  # fmt: skip
    for method in methods:
        for size in ("1", "4"):
            s = data["gbps"][method][size]
            assert s["n"] == data["repetitions"] and s["min"] <= s["median"] <= s["max"]
            assert ok(s["min"]), (method, size, s)
    for ratio in ("pdworker_e2e/raw_nixl", "pdworker_transport/raw_nixl", "raw_nixl/memcpy",
                  "pdworker_e2e/raw_nixl_beside_forward"):  # fmt: skip
        assert all(ok(v) for v in data["ratios"][ratio].values())
    assert data["recommended_ucx"] in data["ucx_mean_raw_gbps"]
    # Prefill's forward is reported beside its wire time, per room (seconds).
    forward = data["pdworker_prefill_forward_s"]
    assert set(forward) == {"1", "4"} and all(ok(s["median"]) for s in forward.values())


def test_kv_storm(results: dict[str, Any]) -> None:
    data = check(results, "kv_storm")
    assert data["load"]["requests"] > 0
    for name, probe in data["probes"].items():
        assert probe["n"] > 0 and ok(probe["p99_ms"]), (name, probe)
    assert set(data["goals"]) == {
        "health_p99_lt_100ms", "no_peer_lost", "no_leaks", "no_checksum_mismatch"
    }  # fmt: skip
    assert data["goals"]["no_leaks"] and data["goals"]["no_checksum_mismatch"], data["after"]


def test_request_path(results: dict[str, Any]) -> None:
    data = check(results, "request_path")
    for kv in ("small", "large"):
        for c in data["concurrency"]:
            row = data["results"][f"{kv}/c{c}"]
            for key in ("requests_per_s", "p50_s", "p99_s", "prefill_kv_transfer_mean_s"):
                assert ok(row[key]["median"]), (kv, c, key, row[key])
            assert row["p50_s"]["median"] <= row["p99_s"]["median"]


def test_abort_storm(results: dict[str, Any]) -> None:
    data = check(results, "abort_storm")
    assert ok(data["throughput_requests_per_s"]) and data["load"]["cancelled"] > 0
    assert data["leaked_rooms"] == 0 and data["leak_free"], data["after"]
    assert data["unexpected_failures"] == {}


def test_recovery(results: dict[str, Any]) -> None:
    data = check(results, "recovery")
    sc = data["scenarios"]["aggressive"]
    sd = sc["stalled_decode"]
    assert ok(sd["onset_to_rooms_drained_seconds"])
    assert sd["onset_to_pool_whole_seconds"] >= sd["onset_to_rooms_drained_seconds"] - 1
    kinds = [a["action"] for a in sd["actions"]]
    assert "CordonDecode" in kinds and "RestartDecode" in kinds
    assert "abort_race" in sc and data["without_pdwarden"]["abort_race_seconds"] is None
    lp = data["long_prefill_false_positives"]
    assert lp["pdworker"]["false_positives"] == 0 and lp["pdworker"]["request_ok"], lp["pdworker"]
    assert lp["sglang"]["false_positives"] == 0 and lp["sglang"]["control_wedge_findings"] > 0


def test_operator_scale(results: dict[str, Any]) -> None:
    data = check(results, "operator_scale")
    lean, old = data["results"]  # the shipped client, then every GET through aiohttp
    assert (lean["client"], old["client"]) == ("http1", "aiohttp")
    for row in (lean, old):
        assert row["pods"] == 50 and row["scrape_errors"] == 0
        for key in ("cpu_seconds_per_cycle", "wall_seconds_per_cycle"):
            assert ok(row[key]["median"])
        assert ok(row["rss_mb_after"])
    assert lean["profile_top_tottime"] and ok(data["cpu_ratio_http1_vs_aiohttp"]["50"])
