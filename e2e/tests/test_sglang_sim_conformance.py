"""The SIMULATED SGLang server against SGLang 0.5.23's own source (issue 25).

Two halves. Exposition: the simulator's /metrics (the process the local kubelet runs, over
HTTP) is read side by side with a body rendered from the wheel's own metrics_collector.py
definitions for the same label values (e2e/sglang_exposition.py): same families, types,
samples, label names and bucket boundaries. Behaviour: what a /health probe moves is exactly
what the source says it moves (line numbers in e2e/sglang_sim.py's docstring), and a probe that
finds requests running is answered without touching a counter. The wheel is fetched with pip
(cached); the exposition half skips with a clear message only if the registry is unreachable.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.harness import wait_for
from e2e import sglang_exposition as expo
from e2e import sglang_source
from e2e.sglang_sim import parse_args
from e2e.sglang_sim_engine import Engine
from e2e.sglang_sim_series import SERIES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

SIM = Path(__file__).resolve().parents[1] / "sglang_sim.py"
Key = tuple[str, frozenset[tuple[str, str]]]


@pytest.fixture(scope="module")
def defs() -> dict[str, sglang_source.MetricDef]:
    try:
        return sglang_source.by_exposed_name(sglang_source.definitions())
    except sglang_source.SourceUnavailable as e:
        pytest.skip(f"sglang {sglang_source.VERSION} wheel not reachable from PyPI: {e}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["prefill", "decode"])
def sim(request: pytest.FixtureRequest) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SIM), "--model-path", "m", "--disaggregation-mode", request.param,
         "--host", "127.0.0.1", "--port", str(port), "--dp-size", "2",
         "--enable-priority-scheduling"],
        env={"PATH": "/usr/bin:/bin", "SGLANG_SIM_PHASE": "idle"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                return bool(resp.status == 200)

        wait_for(ready, 30, "the simulator's /ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _samples(text: str) -> dict[str, set[Key]]:
    """Family -> its samples by (sample name, labels), values and `_created` left out."""
    out: dict[str, set[Key]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, set()).update(
            (s.name, frozenset(s.labels.items()))
            for s in family.samples
            if not s.name.endswith("_created")
        )
    return out


def test_the_simulators_metrics_read_like_sglangs_own(
    sim: str, defs: dict[str, sglang_source.MetricDef]
) -> None:
    for phase in ("healthy", "idle"):  # every series the simulator writes now exists
        req = urllib.request.Request(sim + "/sim/phase", json.dumps({"phase": phase}).encode())
        urllib.request.urlopen(req, timeout=5).close()
    for _ in range(4):
        assert urllib.request.urlopen(sim + "/health", timeout=5).status == 200
    ours = _samples(_get(sim + "/metrics"))
    families = {f.name: f for f in text_string_to_metric_families(_get(sim + "/metrics"))}
    reference = expo.Plan()
    for name, family in families.items():
        d = defs.get(name)
        assert d is not None, f"{name}: no such metric in sglang {sglang_source.VERSION}"
        assert family.type == d.kind.lower(), name
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        label_sets = sorted({tuple(sorted(s.labels.items())) for s in samples})
        label_sets = sorted({tuple((k, v) for k, v in ls if k != "le") for ls in label_sets})
        reference.add(d, [dict(ls) for ls in label_sets])
    theirs = _samples(expo.render(reference))
    assert ours == theirs


def test_the_simulators_help_text_and_modes_are_the_sources(
    defs: dict[str, sglang_source.MetricDef],
) -> None:
    for kind, name, doc, _ in SERIES.values():
        d = defs[name]
        assert (d.kind.lower(), d.documentation) == (kind, doc), name
        if kind == "gauge":
            assert d.multiprocess_mode == "mostrecent", name


# -- behaviour: what a probe moves ---------------------------------------------------------


def engine(role: str, phase: str) -> tuple[Engine, CollectorRegistry]:
    registry = CollectorRegistry()
    now = [100.0]
    args = parse_args(["--model-path", "m", "--disaggregation-mode", role])
    e = Engine(args, registry=registry, clock=lambda: now[0], seed="t")
    e.set_phase(phase)
    now[0] += 10
    return e, registry


def values(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            if s.name.endswith(("_count", "_total")) or family.type == "gauge":
                extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                 if k in ("mode", "stage", "is_streaming"))  # fmt: skip
                out[f"{s.name}{{{extra}}}"] = s.value
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def test_a_probe_on_a_wedged_prefill_moves_what_sglang_moves_and_nothing_else() -> None:
    e, registry = engine("prefill", "wedged")
    before = values(registry)
    assert e.health("/health") == 200
    assert moved(before, values(registry)) == {
        "sglang:realtime_tokens_total{mode=prefill_compute}": 1,
        "sglang:per_stage_req_latency_seconds_count{stage=prefill_bootstrap}": 1,
        "sglang:per_stage_req_latency_seconds_count{stage=prefill_forward}": 1,
        "sglang:per_stage_req_latency_seconds_count{stage=prefill_transfer_kv_cache}": 1,
        "sglang:queue_time_seconds_count{}": 1,
        # The probe's batch report: running 1 (the probe), the probe counted inflight; a wedged
        # prefill is never fully idle, so nothing republishes them until the next batch.
        "sglang:num_prefill_inflight_queue_reqs{}": 1,
        "sglang:num_running_reqs{}": -2,
    }
    assert e.state()["held"]["inflight"] == 3


def test_a_probe_on_an_idle_prefill_leaves_its_gauges_idle() -> None:
    e, registry = engine("prefill", "idle")
    assert e.health("/health_generate") == 200
    after = values(registry)
    inflight = after["sglang:num_prefill_inflight_queue_reqs{}"]
    assert after["sglang:num_running_reqs{}"] == inflight == 0


def test_a_probe_on_a_stalled_decode_moves_only_stage_latencies() -> None:
    e, registry = engine("decode", "stalled")
    before = values(registry)
    assert e.health("/health") == 200
    assert moved(before, values(registry)) == {
        f"sglang:per_stage_req_latency_seconds_count{{stage={s}}}": 1
        for s in ("decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
                  "quick_finish")
    }  # fmt: skip


def test_a_probe_that_finds_requests_running_moves_nothing() -> None:
    e, registry = engine("decode", "long")
    before = values(registry)
    assert e.health("/health") == 200
    assert moved(before, values(registry)) == {}
    assert e.probes == {"ran": 0, "skipped": 1}


def test_health_without_generation_and_before_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    e, registry = engine("prefill", "wedged")
    before = values(registry)
    monkeypatch.setenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "false")
    assert e.health("/health") == 200 and moved(before, values(registry)) == {}
    assert e.health("/health_generate") == 200 and moved(before, values(registry)) != {}
    cold = Engine(parse_args(["--model-path", "m", "--disaggregation-mode", "decode"]),
                  registry=CollectorRegistry(), clock=lambda: 0.0)  # fmt: skip
    assert cold.health("/health") == 503
