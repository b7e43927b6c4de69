"""The simulated SGLang scheduler: its queues per phase, and what it writes to the metrics when.

It does what SGLang 0.5.23 does (e2e/sglang_sim.py's docstring cites the source lines). Why apart
from the HTTP shell: a test drives an `Engine` on a clock of its own
(tests/remediation/test_sglang_simulated_time.py) without a server or a process.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable
from typing import Any

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
