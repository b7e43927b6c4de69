"""A SIMULATED stock SGLang 0.5.23 PD server, for the local cluster. No model, no GPU, no KV.

Why: pdwarden must be tested against how SGLang looks from outside (its /metrics exposition, its
probes, its abort call), and real SGLang needs GPUs this machine does not have. This program
stands in for `python3 -m sglang.launch_server` (the local kubelet runs it for images whose
repository ends in `sglang`, e2e/kubelet/images.py) and plays scripted phases per pod. It follows
SGLang 0.5.23's source (line numbers below are of srt/ in the 0.5.23 wheel); nothing is copied
from it, and e2e/tests/test_sglang_sim_conformance.py reads its output side by side with bodies
built from the wheel's own metric definitions.

* /metrics: prometheus-client in multiprocess mode behind a MultiProcessCollector, as
  utils/common.py `add_prometheus_middleware` does. Names, types, buckets and labels as in
  observability/metrics_collector.py (e2e/sglang_sim_series.py).
* Gauges are published the way the scheduler publishes them, not every tick: at each batch
  report, and by the idle path only when the scheduler is *fully* idle (managers/scheduler.py:
  5241-5272, metrics_reporter.py:1476-1525: at once if the running gauge is stale, else every
  30 s). A prefill whose inflight queue is wedged is never fully idle: its gauges freeze at
  the last batch. On a PD prefill the running gauge is that batch, whose requests were already
  appended to the inflight queue (disaggregation/prefill.py:1034, report at :1142).
* /health and /health_generate go through the scheduler (entrypoints/http_server.py:721-799):
  503 until warm; with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, /health answers without
  generating (:745-749). Otherwise a one-token request with a fake KV peer reaches one DP rank
  (round robin, managers/data_parallel_controller.py:845-863) and runs unless that rank has
  requests running or waiting: the disaggregation queues do not count (scheduler.py:2241-2248,
  :5337-5367). Running, it moves exactly what SGLang moves for it: on a prefill one prompt token
  of `realtime_tokens_total{mode="prefill_compute"}` (metrics_reporter.py:810), the stages
  prefill_bootstrap, prefill_forward and prefill_transfer_kv_cache and `queue_time_seconds`,
  and a batch report (running 1, the probe counted inflight); on a decode the stages
  decode_prepare, decode_bootstrap, decode_transferred, fake_output and quick_finish (it
  finishes in the prebuilt batch, managers/scheduler_components/batch_result_processor.py:
  117-132). Never `kv_transfer_*` (disaggregation/prefill.py:1250 skips the fake peer), never
  the tokenizer's counters (`log_metrics=False`, tokenizer_manager.py:2788), never decode steps.
* POST /abort_request {"rid", "abort_all"}: abort_all drops every request the scheduler holds
  (scheduler.py:5675-5812): the waiting queue at once; bootstrap and inflight rooms fail at the
  next poll and count in `num_bootstrap_failed_reqs_total` / `num_transfer_failed_reqs_total`
  (disaggregation/prefill.py:1377, :1312) and as finished requests; one call counts once in
  `num_aborted_requests_total` (tokenizer_manager.py:2261-2265).

Phases (set per pod by the test through POST /sim/phase, a test-only knob on a loopback pod IP;
GET /sim/state reports what the simulator did): prefill `healthy` (saturated: the inflight queue
never empties but drains), `wedged` (rooms stay in the inflight queue until an abort), `wedged
-sticky` (an abort does not free them), `idle`; decode `healthy` (short requests), `long` (four long
requests: throughput, no finishes), `idle`, `stalled` (requests wait in the transfer queue, no
throughput). A restarted pod starts again in the phase of $SGLANG_SIM_PHASE (default healthy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

if not __package__:  # run as a script by the local kubelet: make `e2e` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from e2e.sglang_sim_engine import PHASE_ENV, TICK, Engine


def parse_args(argv: list[str]) -> argparse.Namespace:
    """SGLang's launch flags that matter here; every other flag is accepted and ignored."""
    p = argparse.ArgumentParser(prog="sglang_sim")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--disaggregation-mode", choices=("prefill", "decode"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-priority-scheduling", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    args, _unknown = p.parse_known_args(argv)
    return args


async def serve(args: argparse.Namespace, engine: Engine, registry: Any) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_: web.Request) -> web.Response:
        engine.metrics_reads += 1
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def ready(_: web.Request) -> web.Response:
        return web.Response(status=200 if engine.warm else 503)

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=engine.health(request.path))

    async def abort(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.content.read(4096) or b"{}")
        except ValueError:
            return web.Response(status=400, text="body is not JSON")
        if isinstance(body, dict) and body.get("abort_all") is True:
            engine.abort_all()
        return web.Response(status=200)  # SGLang answers 200 whatever it aborted

    async def set_phase(request: web.Request) -> web.Response:
        try:
            engine.set_phase(str(json.loads(await request.content.read(1024))["phase"]))
        except (ValueError, KeyError, TypeError) as e:
            return web.Response(status=400, text=str(e))
        return web.json_response(engine.state())

    async def state(_: web.Request) -> web.Response:
        return web.json_response(engine.state())

    app = web.Application(client_max_size=64 * 1024)
    app.add_routes([
        web.get("/metrics", metrics), web.get("/ready", ready), web.get("/health", health),
        web.get("/health_generate", health), web.post("/abort_request", abort),
        web.post("/sim/phase", set_phase), web.get("/sim/state", state),
    ])  # fmt: skip
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # Each local pod has its own loopback IP (pdwarden renders --host $(POD_IP)).
    host = os.environ.get("POD_IP") or args.host
    await web.TCPSite(runner, host, args.port).start()
    print(f"SIMULATED sglang {engine.role} on {host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        engine.tick()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TICK)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    mp_dir = tempfile.mkdtemp(prefix="sglang-sim-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    try:
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        engine = Engine(args)
        engine.set_phase(os.environ.get(PHASE_ENV, "healthy"))
        asyncio.run(serve(args, engine, registry))
    finally:
        shutil.rmtree(mp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
