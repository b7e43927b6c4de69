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
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if not __package__:  # run as a script by the local kubelet: make `e2e` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from e2e.sglang_sim_series import make_metrics

PHASE_ENV = "SGLANG_SIM_PHASE"  # the phase a (re)started pod begins in; default healthy
GENERATE_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"  # srt/environ.py:344, default true
TICK = 0.25
WARMUP_SECONDS = 1.0
IDLE_REPUBLISH_SECONDS = 30.0  # metrics_reporter.py:1494-1498
LONG_REQUESTS = 4
LONG_THROUGHPUT = 800.0  # tokens/s over four long requests
WEDGED_ROOMS = 3
PREFILL_PHASES = ("healthy", "wedged", "wedged-sticky", "idle")
DECODE_PHASES = ("healthy", "long", "idle", "stalled")
QUEUES = ("waiting", "running", "bootstrap", "inflight", "prealloc", "transfer")
PROBE_STAGES = {
    "prefill": ("prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache"),
    "decode": ("decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
               "quick_finish"),
}  # fmt: skip


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


class Engine:
    """One simulated SGLang server: its scheduler state and its metric objects.

    `registry` is where the metrics register (None: prometheus-client's default, as SGLang);
    `clock` is the scheduler's time, so a test can run minutes of it in a moment."""

    def __init__(
        self,
        args: argparse.Namespace,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
        seed: str | None = None,
    ) -> None:
        self.role = args.disaggregation_mode
        self.phase = "healthy"
        self.clock = clock
        self.started = clock()
        self.rng = random.Random(seed if seed is not None else os.environ.get("POD_UID", "sim"))
        self.aborts: list[dict[str, Any]] = []
        self.probes = {"ran": 0, "skipped": 0}
        self.metrics_reads = 0  # GET /metrics since the phase was last set (the test's clock)
        self.served = False
        self.dp = max(1, args.dp_size)
        self.priority = bool(args.enable_priority_scheduling)
        model = args.served_model_name or args.model_path
        self.sched_labels = {"model_name": model, "engine_type": self.role, "tp_rank": "0",
                             "pp_rank": "0", "moe_ep_rank": "0"}  # fmt: skip
        if self.priority:
            self.sched_labels["priority"] = ""
        self.tok_labels = {"model_name": model, "engine_type": self.role}
        if self.priority:
            self.tok_labels["priority"] = ""
        sched = list(self.sched_labels) + (["dp_rank"] if self.dp > 1 else [])
        self.m = make_metrics(sched, list(self.tok_labels), registry)
        self.held = [dict.fromkeys(QUEUES, 0) for _ in range(self.dp)]
        self.batch = [0] * self.dp  # prefill: the last forward batch (the running gauge)
        self.lens = [0.0] * self.dp
        self.tput = [0.0] * self.dp
        self.published_at = [self.started] * self.dp
        self.running_gauge = [0] * self.dp
        self.next_probe_rank = 0

    def _share(self, total: int, rank: int) -> int:
        """Rank `rank`'s part of `total` requests spread over the dp ranks."""
        return total // self.dp + (1 if rank < total % self.dp else 0)

    def _l(self, rank: int, priority: str | None = None) -> dict[str, str]:
        labels = dict(self.sched_labels)
        if priority is not None:
            labels["priority"] = priority
        if self.dp > 1:
            labels["dp_rank"] = str(rank)
        return labels

    @property
    def warm(self) -> bool:
        return self.clock() - self.started >= WARMUP_SECONDS

    def set_phase(self, phase: str) -> None:
        allowed = PREFILL_PHASES if self.role == "prefill" else DECODE_PHASES
        if phase not in allowed:
            raise ValueError(f"{self.role} phases are {', '.join(allowed)}, not {phase!r}")
        if not self.served:
            self._serve_one()  # a pod in a scenario has served before: its counters exist
        self.phase, self.metrics_reads = phase, 0
        for rank in range(self.dp):
            self.held[rank] = dict.fromkeys(QUEUES, 0)
            self.batch[rank] = 0
            if phase.startswith("wedged"):
                # The rooms' last batch report: they were the batch, now inflight for ever.
                self.batch[rank] = self.held[rank]["inflight"] = self._share(WEDGED_ROOMS, rank)
            elif phase == "long":
                self.held[rank]["running"] = self._share(LONG_REQUESTS, rank)
            elif phase == "stalled":
                self.held[rank].update(transfer=3, prealloc=1)
            self.tput[rank] = 0.0
            self.publish(rank)  # the transition's last report; what the scheduler does next
            self.idle_publish(rank)  # decides whether the gauges ever change again

    # -- what SGLang's scheduler writes ------------------------------------------------------

    def _serve_one(self, rank: int = 0) -> None:
        """One short request end to end on this pod: the counters SGLang then exports."""
        self.served = True
        if self.role == "prefill":
            self.m.realtime_tokens.labels(**self._l(rank), mode="prefill_compute").inc(512)
            self._transfer_done(rank)
            self._finish(rank, prompt=512, generated=0)
        else:
            self.m.stage_latency.labels(**self._l(rank), stage="decode_transferred").observe(0.05)
            self.m.realtime_tokens.labels(**self._l(rank), mode="decode").inc(128)
            self._finish(rank, prompt=512, generated=128)

    def _transfer_done(self, rank: int) -> None:
        """A prefill room's real KV transfer succeeded (disaggregation/prefill.py:1222-1264)."""
        labels = self._l(rank)
        self.m.latency.labels(**labels).observe(self.rng.uniform(20, 200))
        self.m.speed.labels(**labels).observe(self.rng.uniform(5, 40))
        self.m.size.labels(**labels).observe(self.rng.uniform(10, 400))
        self.m.stage_latency.labels(**labels, stage="prefill_transfer_kv_cache").observe(
            self.rng.uniform(0.02, 0.2)
        )

    def _finish(self, rank: int, prompt: int, generated: int) -> None:
        """The tokenizer's observe_one_finished_request (metrics_collector.py:2092-2152)."""
        labels = {**self.tok_labels, "is_streaming": "false"}
        self.m.requests.labels(**labels).inc()
        self.m.prompt_tokens.labels(**labels).inc(prompt)
        if generated:
            self.m.gen_tokens.labels(**labels).inc(generated)

    def publish(self, rank: int, running: int | None = None, inflight: int = 0) -> None:
        """A batch report of one rank: log_stats writes every queue gauge at once."""
        h = self.held[rank]
        if running is None:
            running = self.batch[rank] if self.role == "prefill" else h["running"]
        run = running
        values = {**h, "running": run, "inflight": h["inflight"] + inflight}
        for key in ("running", "waiting", "bootstrap", "inflight", "prealloc", "transfer"):
            gauge = getattr(self.m, key)
            gauge.labels(**self._l(rank)).set(values[key])
            if self.priority:  # every request at the default priority 0
                gauge.labels(**self._l(rank, "0")).set(values[key])
        self.m.throughput.labels(**self._l(rank)).set(self.tput[rank])
        self.m.seq_lens.labels(**self._l(rank)).set(self.lens[rank])
        self.published_at[rank], self.running_gauge[rank] = self.clock(), run

    def fully_idle(self, rank: int) -> bool:
        """is_fully_idle(): nothing held in any queue (scheduler.py:5337-5405)."""
        return not any(self.held[rank].values())

    def idle_publish(self, rank: int) -> None:
        """The idle path: only when fully idle, at once if the running gauge is stale, else
        every 30 s (metrics_reporter.py:1476-1525)."""
        if not self.fully_idle(rank):
            return
        stale = self.running_gauge[rank] != 0
        if stale or self.clock() - self.published_at[rank] > IDLE_REPUBLISH_SECONDS:
            self.batch[rank], self.tput[rank] = 0, 0.0
            self.publish(rank)

    # -- traffic -------------------------------------------------------------------------------

    def health(self, path: str = "/health") -> int:
        """GET /health or /health_generate: the HTTP status SGLang would answer."""
        if not self.warm:
            return 503
        if path == "/health" and os.environ.get(GENERATE_ENV, "true").lower() in ("0", "false"):
            return 200
        rank = self.next_probe_rank
        self.next_probe_rank = (rank + 1) % self.dp
        h = self.held[rank]
        if h["running"] or h["waiting"]:
            self.probes["skipped"] += 1  # ongoing requests answer for it (scheduler.py:2241)
            return 200
        self.probes["ran"] += 1
        labels = self._l(rank)
        for stage in PROBE_STAGES[self.role]:
            self.m.stage_latency.labels(**labels, stage=stage).observe(0.001)
        if self.role == "prefill":
            self.m.realtime_tokens.labels(**labels, mode="prefill_compute").inc(1)
            self.m.queue_time.labels(**labels).observe(0.0005)
            self.publish(rank, running=1, inflight=1)  # the probe's batch, counted inflight
            self.idle_publish(rank)  # the probe left: republished only if now fully idle
        return 200

    def abort_all(self) -> int:
        """Scheduler.abort_request with abort_all: every held request is aborted."""
        total = sum(h["waiting"] + h["bootstrap"] + h["inflight"] + h["running"]
                    + h["prealloc"] + h["transfer"] for h in self.held)  # fmt: skip
        self.m.aborted.labels(**self.tok_labels).inc()
        sticky = self.phase == "wedged-sticky"
        for rank, h in enumerate(self.held):
            for _ in range(h["bootstrap"]):
                self.m.boot_failed.labels(**self._l(rank)).inc()
                self._finish(rank, prompt=0, generated=0)
            freed_inflight = 0 if sticky else h["inflight"]
            for _ in range(freed_inflight):
                self.m.xfer_failed.labels(**self._l(rank)).inc()
                self._finish(rank, prompt=0, generated=0)
            for _ in range(h["running"] + h["prealloc"] + h["transfer"]):
                self._finish(rank, prompt=0, generated=0)
            h.update(dict.fromkeys(h, 0), inflight=h["inflight"] - freed_inflight)
            self.idle_publish(rank)
        if not sticky:
            self.phase = "idle"
        self.aborts.append({"held": total, "phase_after": self.phase, "at": time.time(),
                            "metrics_reads_since_phase": self.metrics_reads})  # fmt: skip
        return total

    def tick(self, dt: float = TICK) -> None:
        for rank in range(self.dp):
            getattr(self, f"_tick_{self.role}")(rank, dt)

    def _tick_prefill(self, rank: int, dt: float) -> None:
        h = self.held[rank]
        if self.phase != "healthy":
            self.idle_publish(rank)
            return
        # Saturated but healthy: rooms finish their transfer and new ones arrive every tick,
        # so the inflight queue drains without ever reaching 0.
        for _ in range(self.rng.randint(1, 3)):
            prompt = self.rng.randint(200, 2000)
            self.m.realtime_tokens.labels(**self._l(rank), mode="prefill_compute").inc(prompt)
            self._transfer_done(rank)
            self._finish(rank, prompt=prompt, generated=0)
        self.batch[rank] = self.rng.randint(0, 2)  # this tick's batch, appended inflight
        h.update(waiting=self.rng.randint(0, 4), bootstrap=self.rng.randint(0, 2),
                 inflight=self.rng.randint(1, 4) + self.batch[rank])  # fmt: skip
        self.publish(rank)

    def _tick_decode(self, rank: int, dt: float) -> None:
        h = self.held[rank]
        if self.phase == "healthy":
            for _ in range(self.rng.randint(1, 3)):
                self._finish(rank, prompt=self.rng.randint(100, 1000),
                             generated=self.rng.randint(16, 256))  # fmt: skip
                self.m.stage_latency.labels(**self._l(rank), stage="decode_transferred").observe(
                    self.rng.uniform(0.01, 0.2)
                )
            h.update(running=self.rng.randint(2, 8), transfer=self.rng.randint(0, 2))
            self.tput[rank] = self.rng.uniform(300, 900)
            self.lens[rank] = h["running"] * self.rng.uniform(500, 1500)
        elif self.phase == "long":
            # Four long requests decoding: tokens flow, nothing finishes, so the tokenizer's
            # finish-time counters stay flat while throughput and sequence lengths move.
            share = self._share(LONG_REQUESTS, rank) / LONG_REQUESTS
            self.tput[rank] = LONG_THROUGHPUT * share * self.rng.uniform(0.9, 1.1)
            self.lens[rank] += self.tput[rank] * dt
        else:  # idle, stalled: no decode batch runs; only the idle path may publish
            self.idle_publish(rank)
            return
        # report_decode_stats: realtime tokens every decode step (metrics_reporter.py:901-916)
        self.m.realtime_tokens.labels(**self._l(rank), mode="decode").inc(int(self.tput[rank] * dt))
        self.publish(rank)

    def state(self) -> dict[str, Any]:
        held = {k: sum(h[k] for h in self.held) for k in QUEUES}
        return {"role": self.role, "phase": self.phase, "held": held, "aborts": self.aborts,
                "probes": self.probes, "simulated": True}  # fmt: skip


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
    # Each local pod has its own loopback IP; SGLang's --host 0.0.0.0 would collide across pods.
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
