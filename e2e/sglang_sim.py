"""A SIMULATED stock SGLang 0.5.23 PD server, for the local cluster. No model, no GPU, no KV.

Why: pdwarden must be tested against how SGLang looks from outside (its /metrics exposition, its
probes, its abort call), and real SGLang needs GPUs this machine does not have. This program
stands in for `python3 -m sglang.launch_server` (the local kubelet runs it for images whose
repository ends in `sglang`, e2e/kubelet/images.py) and plays scripted phases per pod. It follows
SGLang 0.5.23's source; nothing here is copied from it:

* /metrics: prometheus-client in multiprocess mode with a MultiProcessCollector registry, as
  utils/common.py `add_prometheus_middleware` does (HELP and ordering are then whatever that
  collector writes, as on a real server). Names, types, multiprocess_mode and label sets as in
  observability/metrics_collector.py: scheduler series carry
  model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+ priority="" with
  --enable-priority-scheduling, + dp_rank with --dp-size > 1); queue gauges are also written per
  priority; tokenizer counters carry model_name, engine_type (+ priority) + is_streaming and
  move only when a request FINISHES (`observe_one_finished_request`), so during long decodes
  `generation_tokens_total` and `num_requests_total` stay flat while `gen_throughput`,
  `decode_sum_seq_lens` and the scheduler's `realtime_tokens_total{mode="decode"}` move.
  Prefill KV-transfer histograms and `per_stage_req_latency_seconds{stage=
  "prefill_transfer_kv_cache"}` are observed per finished transfer (disaggregation/prefill.py,
  observability/req_time_stats.py), `{stage="decode_transferred"}` per KV received on decode. A
  pod in a scenario has served one request before its first phase, so its counters exist (a
  fresh SGLang exports a labelled counter only after its first increment).
* /ready (200 once "warm", no generation), /health and /health_generate
  (entrypoints/http_server.py).
* POST /abort_request {"rid", "abort_all"}: abort_all drops every request the "scheduler" holds
  (managers/scheduler.py `abort_request`), always answers 200, and counts one call in
  `sglang:num_aborted_requests_total` (tokenizer_manager.py), not one per request.

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
from typing import Any

PHASE_ENV = "SGLANG_SIM_PHASE"  # the phase a (re)started pod begins in; default healthy
TICK = 0.25
WARMUP_SECONDS = 1.0
LONG_REQUESTS = 4
LONG_THROUGHPUT = 800.0  # tokens/s over four long requests
WEDGED_ROOMS = 3
PREFILL_PHASES = ("healthy", "wedged", "wedged-sticky", "idle")
DECODE_PHASES = ("healthy", "long", "idle", "stalled")
# attribute -> (type, name, HELP, buckets or is_streaming), as in SGLang 0.5.23
# observability/metrics_collector.py (counters are named without `_total`, which
# prometheus-client appends, exactly as SGLang's own `..._total` names come out).
SERIES: dict[str, tuple[str, str, str, Any]] = {
    "running": ("gauge", "sglang:num_running_reqs", "The number of running requests.", None),
    "queue": ("gauge", "sglang:num_queue_reqs",
              "The number of requests in the waiting queue.", None),
    "throughput": ("gauge", "sglang:gen_throughput", "The generation throughput (token/s).",
                   None),
    "seq_lens": ("gauge", "sglang:decode_sum_seq_lens",
                 "The sum of all sequence lengths in decode.", None),
    "bootstrap": ("gauge", "sglang:num_prefill_bootstrap_queue_reqs",
                  "The number of requests in the prefill bootstrap queue.", None),
    "inflight": ("gauge", "sglang:num_prefill_inflight_queue_reqs",
                 "The number of requests in the prefill inflight queue.", None),
    "prealloc": ("gauge", "sglang:num_decode_prealloc_queue_reqs",
                 "The number of requests in the decode prealloc queue.", None),
    "transfer": ("gauge", "sglang:num_decode_transfer_queue_reqs",
                 "The number of requests in the decode transfer queue.", None),
    "boot_failed": ("counter", "sglang:num_bootstrap_failed_reqs",
                    "The number of bootstrap failed requests.", None),
    "xfer_failed": ("counter", "sglang:num_transfer_failed_reqs",
                    "The number of transfer failed requests.", None),
    "latency": ("histogram", "sglang:kv_transfer_latency_ms",
                "Histogram of KV cache transfer latency in ms.",
                (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)),
    "speed": ("histogram", "sglang:kv_transfer_speed_gb_s",
              "Histogram of KV cache transfer speed in GB/s.",
              (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)),
    "size": ("histogram", "sglang:kv_transfer_total_mb",
             "Histogram of KV cache transfer size in MB.",
             (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)),
    "realtime_tokens": ("counter", "sglang:realtime_tokens",
                        "Total number of tokens processed (updated on each log interval). "
                        "mode: prefill_compute, prefill_cache, decode.", "mode"),
    "stage_latency": ("histogram", "sglang:per_stage_req_latency_seconds",
                      "The latency of each stage of requests.",
                      tuple(0.001 * 1.62**i for i in range(30))),
    "prompt_tokens": ("counter", "sglang:prompt_tokens", "Number of prefill tokens processed.",
                      True),
    "gen_tokens": ("counter", "sglang:generation_tokens",
                   "Number of generation tokens processed.", True),
    "requests": ("counter", "sglang:num_requests", "Number of requests processed.", True),
    "aborted": ("counter", "sglang:num_aborted_requests", "Number of requests aborted.", False),
}  # fmt: skip
TOKENIZER_SERIES = frozenset({"prompt_tokens", "gen_tokens", "requests", "aborted"})


def parse_args(argv: list[str]) -> argparse.Namespace:
    """SGLang's launch flags that matter here; every other flag is accepted and ignored."""
    p = argparse.ArgumentParser(prog="sglang_sim")
    p.add_argument("--model-path", required=True)
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
    """One simulated SGLang server: its scheduler state and its metric objects."""

    def __init__(self, args: argparse.Namespace) -> None:
        # Imported here: prometheus-client reads PROMETHEUS_MULTIPROC_DIR at import time.
        from prometheus_client import Counter, Gauge, Histogram

        self.role = args.disaggregation_mode
        self.phase = "healthy"
        self.started = time.monotonic()
        self.rng = random.Random(os.environ.get("POD_UID", "sim"))
        self.aborts: list[dict[str, Any]] = []
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
        names = list(self.sched_labels) + (["dp_rank"] if self.dp > 1 else [])

        for attr, (kind, name, doc, extra) in SERIES.items():
            cls = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}[kind]
            kw: dict[str, Any] = {"labelnames": names}
            if kind == "gauge":
                kw["multiprocess_mode"] = "mostrecent"
            elif kind == "histogram":
                kw["buckets"] = extra
            if attr == "realtime_tokens":
                kw["labelnames"] = [*names, "mode"]
            elif attr == "stage_latency":
                kw["labelnames"] = [*names, "stage"]
            if attr in TOKENIZER_SERIES:
                kw["labelnames"] = [*self.tok_labels, *(["is_streaming"] if extra else [])]
            setattr(self, attr, cls(name, doc, **kw))
        # Scheduler state per dp rank: requests by queue, and the long requests' lengths.
        queues = ("waiting", "running", "bootstrap", "inflight", "prealloc", "transfer")
        self.held = [dict.fromkeys(queues, 0) for _ in range(self.dp)]
        self.lens = [0.0] * self.dp
        self.tput = [0.0] * self.dp

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
        return time.monotonic() - self.started >= WARMUP_SECONDS

    def set_phase(self, phase: str) -> None:
        allowed = PREFILL_PHASES if self.role == "prefill" else DECODE_PHASES
        if phase not in allowed:
            raise ValueError(f"{self.role} phases are {', '.join(allowed)}, not {phase!r}")
        if not self.served:
            self._serve_one()  # a pod in a scenario has served before: its counters exist
        self.phase = phase
        for rank in range(self.dp):
            self.held[rank] = dict.fromkeys(self.held[rank], 0)
            if phase.startswith("wedged"):
                self.held[rank]["inflight"] = self._share(WEDGED_ROOMS, rank)
            elif phase == "long":
                self.held[rank]["running"] = self._share(LONG_REQUESTS, rank)
            elif phase == "stalled":
                self.held[rank].update(transfer=3, prealloc=1)

    def _serve_one(self, rank: int = 0) -> None:
        """One short request end to end on this pod: the counters SGLang then exports."""
        self.served = True
        if self.role == "prefill":
            self.realtime_tokens.labels(**self._l(rank), mode="prefill_compute").inc(512)
            self._transfer_done(rank)
            self._finish(rank, prompt=512, generated=0)
        else:
            self.stage_latency.labels(**self._l(rank), stage="decode_transferred").observe(0.05)
            self.realtime_tokens.labels(**self._l(rank), mode="decode").inc(128)
            self._finish(rank, prompt=512, generated=128)

    def _transfer_done(self, rank: int) -> None:
        """A prefill room's KV transfer finished (disaggregation/prefill.py observes these)."""
        labels = self._l(rank)
        self.latency.labels(**labels).observe(self.rng.uniform(20, 200))
        self.speed.labels(**labels).observe(self.rng.uniform(5, 40))
        self.size.labels(**labels).observe(self.rng.uniform(10, 400))
        self.stage_latency.labels(**labels, stage="prefill_transfer_kv_cache").observe(
            self.rng.uniform(0.02, 0.2)
        )

    def abort_all(self) -> int:
        """Scheduler.abort_request with abort_all: every held request is aborted."""
        total = sum(sum(h.values()) for h in self.held)
        self.aborted.labels(**self.tok_labels).inc()
        if self.phase == "wedged-sticky":
            # Requests outside the wedged rooms go; the rooms themselves stay (a transfer the
            # abort cannot reach), so only a restart frees them.
            for h in self.held:
                h.update({k: 0 for k in h if k != "inflight"})
        else:
            # Aborted requests finish with FINISH_ABORT: the tokenizer counts them as finished.
            for rank, h in enumerate(self.held):
                for _ in range(sum(h.values())):
                    self._finish(rank, prompt=0, generated=0)
                h.update(dict.fromkeys(h, 0))
            self.phase = "idle"
        self.aborts.append({"held": total, "phase_after": self.phase, "at": time.time()})
        self.publish()
        return total

    def tick(self) -> None:
        for rank in range(self.dp):
            getattr(self, f"_tick_{self.role}")(rank)
        self.publish()

    def _finish(self, rank: int, prompt: int, generated: int) -> None:
        labels = {**self.tok_labels, "is_streaming": "false"}
        self.requests.labels(**labels).inc()
        self.prompt_tokens.labels(**labels).inc(prompt)
        if generated:
            self.gen_tokens.labels(**labels).inc(generated)

    def _tick_prefill(self, rank: int) -> None:
        h = self.held[rank]
        if self.phase != "healthy":
            return
        # Saturated but healthy: rooms finish their transfer and new ones arrive every tick,
        # so the inflight queue drains without ever reaching 0.
        done = self.rng.randint(1, 3)
        for _ in range(done):
            prompt = self.rng.randint(200, 2000)
            self.realtime_tokens.labels(**self._l(rank), mode="prefill_compute").inc(prompt)
            self._transfer_done(rank)
            self._finish(rank, prompt=prompt, generated=0)
        h.update(waiting=self.rng.randint(0, 4), running=self.rng.randint(0, 2),
                 bootstrap=self.rng.randint(0, 2), inflight=self.rng.randint(1, 6))  # fmt: skip

    def _tick_decode(self, rank: int) -> None:
        h = self.held[rank]
        if self.phase == "healthy":
            finished = self.rng.randint(1, 3)
            for _ in range(finished):
                self._finish(rank, prompt=self.rng.randint(100, 1000),
                             generated=self.rng.randint(16, 256))  # fmt: skip
                self.stage_latency.labels(**self._l(rank), stage="decode_transferred").observe(
                    self.rng.uniform(0.01, 0.2)
                )
            h.update(running=self.rng.randint(2, 8), transfer=self.rng.randint(0, 2))
            self.tput[rank] = self.rng.uniform(300, 900)
            self.realtime_tokens.labels(**self._l(rank), mode="decode").inc(
                int(self.tput[rank] * TICK)
            )
            self.lens[rank] = h["running"] * self.rng.uniform(500, 1500)
        elif self.phase == "long":
            # Four long requests decoding: tokens flow, nothing finishes, so the tokenizer's
            # finish-time counters stay flat while throughput and sequence lengths move.
            share = self._share(LONG_REQUESTS, rank) / LONG_REQUESTS
            self.tput[rank] = LONG_THROUGHPUT * share * self.rng.uniform(0.9, 1.1)
            self.lens[rank] += self.tput[rank] * TICK
            # Per-step token counter of the scheduler (updated each log interval).
            self.realtime_tokens.labels(**self._l(rank), mode="decode").inc(
                int(self.tput[rank] * TICK)
            )
        else:  # idle, stalled: no decode batch runs, the idle path publishes throughput 0
            self.tput[rank] = 0.0

    def publish(self) -> None:
        for rank, h in enumerate(self.held):
            labels = self._l(rank)
            queues = ((self.running, "running"), (self.queue, "waiting"),
                      (self.bootstrap, "bootstrap"), (self.inflight, "inflight"),
                      (self.prealloc, "prealloc"), (self.transfer, "transfer"))  # fmt: skip
            for gauge, key in queues:
                gauge.labels(**labels).set(h[key])
                if self.priority:  # every request at the default priority 0
                    gauge.labels(**self._l(rank, "0")).set(h[key])
            self.throughput.labels(**labels).set(self.tput[rank])
            self.seq_lens.labels(**labels).set(self.lens[rank])

    def state(self) -> dict[str, Any]:
        held = {k: sum(h[k] for h in self.held) for k in self.held[0]}
        return {"role": self.role, "phase": self.phase, "held": held, "aborts": self.aborts,
                "simulated": True}  # fmt: skip


async def serve(args: argparse.Namespace, engine: Engine, registry: Any) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def ready(_: web.Request) -> web.Response:
        return web.Response(status=200 if engine.warm else 503)

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
        engine.publish()
        return web.json_response(engine.state())

    async def state(_: web.Request) -> web.Response:
        return web.json_response(engine.state())

    app = web.Application(client_max_size=64 * 1024)
    app.add_routes([
        web.get("/metrics", metrics), web.get("/ready", ready), web.get("/health", ready),
        web.get("/health_generate", ready), web.post("/abort_request", abort),
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
        engine.publish()
        asyncio.run(serve(args, engine, registry))
    finally:
        shutil.rmtree(mp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
