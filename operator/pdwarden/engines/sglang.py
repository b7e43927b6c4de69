"""Stock SGLang (0.5.23) in PD mode over NIXL: its pods, its router, its series, its ladder.

Why one module: everything pdwarden knows about SGLang (the launch flags it owns, the probes it
renders, what each /metrics series means and which ones a probe moves, which repairs SGLang
allows) is read from one source and must change together. Its launch-flag reader is
`sglang_flags` beside it. The series table is checked against sglang 0.5.23
(`srt/observability/metrics_collector.py`, `srt/managers/scheduler_components/
metrics_reporter.py`, `srt/observability/req_time_stats.py`, `srt/disaggregation/prefill.py`,
`srt/managers/tokenizer_manager.py`).

How SGLang copies combine (`RANK_COPIES`):

* Scheduler series carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`, plus
  `dp_rank` with data parallelism and `priority` with priority scheduling. Each DP rank is its
  own scheduler with its own requests: those are *summed*.
* Within one DP rank, every TP/PP/EP rank that exports (counters and histograms are written by
  every rank whenever metrics are on; gauges by `attn_tp_rank == 0`, or by every rank with
  `--enable-metrics-for-all-schedulers`) reports the *same* scheduler state: TP ranks poll the
  KV senders with an all-reduce, PP ranks reach consensus on finished rids. Summing them would
  multiply the queue by the number of ranks, so we take the *max* of the copies: it never
  under-counts queued work, and a max of counters stays monotone.
* Queue gauges are written twice under priority scheduling: the total under `priority=""` and
  one series per priority. Scheduler series are read at `priority=""` only (absent = "").
  Tokenizer counters instead label each request with its own priority: those are summed.

Progress signals must be ones a health check cannot fake (issue 25). SGLang 0.5.23's `/health`
(entrypoints/http_server.py:721-799, every liveness probe and every router health check) runs a
one-token request with `log_metrics=False` (:761) against a fake KV peer (:764-765) whenever
the scheduler has nothing running or waiting: the disaggregation queues do not count
(managers/scheduler.py:2241-2248, `is_fully_idle(for_health_check=True)` at :5337-5367), so it
runs on a prefill whose inflight queue is wedged and on a decode whose transfer queue is stuck,
and its fake transfer succeeds at once (disaggregation/fake/conn.py:61-75). What that request
moves, and so what we never read:

* on a prefill, `realtime_tokens_total{mode="prefill_compute"}` (one prompt token:
  `report_prefill_stats` runs for every batch, disaggregation/prefill.py:1142 ->
  managers/scheduler_components/metrics_reporter.py:810) and
  `per_stage_req_latency_seconds{stage="prefill_transfer_kv_cache"}` (every Success,
  disaggregation/prefill.py:1235 -> observability/req_time_stats.py:1045-1052);
* on a decode, `per_stage_req_latency_seconds{stage="decode_transferred"}` (every room
  whose KV "arrived", req_time_stats.py:776-799).

What it does not move, and so what progress is read from:

* `sglang:kv_transfer_latency_ms` (histogram; its `_count` is one per room whose real KV
  transfer succeeded): disaggregation/prefill.py:1250 skips FAKE_BOOTSTRAP_HOST rooms before
  `compute_and_observe_kv_transfer_metrics` (:1255, observability/req_time_stats.py:954-999),
  and aborted rooms (:1248, counted as failures instead). Prefill only.
* the tokenizer's `num_requests_total`: `collect_metrics` runs only for `log_metrics`
  requests (managers/tokenizer_manager.py:2788-2789). On a prefill a request finishes when its
  KV transfer ends; on a decode when it ends. Finish-only: movement proves progress, flatness
  proves nothing.
* `realtime_tokens_total{mode="decode"}`, incremented in `report_decode_stats` on every decode
  iteration (metrics_reporter.py:901-916, from batch_result_processor.py:1105): the probe never
  reaches a decode step, it finishes in the prebuilt batch (batch_result_processor.py:117-132,
  max_new_tokens 1 and its first token comes with the "transfer"). `sglang:gen_throughput` is
  refreshed every `decode_log_interval` steps and decays to 0 after 30 s without decode stats.
* the failure counters (`num_bootstrap_failed_reqs_total`, `num_transfer_failed_reqs_total`).

NOT used either: `sglang:generation_tokens_total`, which `observe_one_finished_request` moves
only when a request finishes, so a decode streaming four long answers shows it flat for
minutes. A prefill computing a long prompt shows in its gauges (`num_running_reqs` is the
current forward batch on a PD prefill, metrics_reporter.py:851-858), not in a token counter.
`PROBE_MOVED` lists the series a probe moves; a test keeps this table clear of them, which is
what lets pdwarden render a generating `/health` liveness probe (`_probes`, below).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden.api import PDDeploymentSpec
from pdwarden.api.sglang_knobs import SGLangSpec, shm_size_for
from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL, WORKER_PORT
from pdwarden.engines import sglang_advice, sglang_flags
from pdwarden.engines.launch import CACHE_DIR, SHM_DIR, Launch, Probes
from pdwarden.engines.protocol import (
    Advice,
    AdviceRule,
    MetricTable,
    Obj,
    PrefillRung,
    ProbeMoved,
    Series,
)
from pdwarden.ownership import selector
from pdwarden.values import PairCanary

RANK_COPIES: Final = ("tp_rank", "pp_rank", "moe_ep_rank")
# sgl-router's Kubernetes discovery reads a prefill pod's bootstrap port from this annotation.
SGLANG_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"

# SGLang 0.5.23 entrypoints/http_server.py: /ready answers 200 once warm-up finished and the
# server is not paused, without running anything; /health runs a one-token generation when idle
# and gives up after SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s), so its probe timeout is above it.
# That generation is traffic: it runs even while the disaggregation queues are wedged and moves
# some counters (issue 25). Kept, since it is what restarts a hung scheduler, because detection
# reads progress only from series a probe never moves (PROBE_MOVED below; tests/operator/
# test_render.py holds the two together). Turning it off
# (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false) would not be enough anyway: routers probe too.
# sgl-router 0.3.2 checks each worker's /health every 60 s by default and admits a new one after
# two good checks: a restarted decode waited minutes for its first request. Every 10 s is one
# idle generation per worker and router replica (series pdwarden never reads as progress).
# `router.args` come after, so a user's own --health-check-interval-secs wins.
ROUTER_HEALTH_CHECK_SECONDS: Final = 10
SGLANG_READY_PATH = "/ready"
SGLANG_HEALTH_PATH = "/health"
SGLANG_HEALTH_TIMEOUT_SECONDS = 25
SGLANG_STARTUP_PERIOD_SECONDS = 10
# Where SGLang and its libraries write (srt/environ.py: SGLANG_CACHE_DIR and
# third_party_cache_defaults(), which puts Triton, Inductor, CUDA, TileLang and FlashInfer caches
# below it; huggingface_hub: HF_HOME). HOME covers anything that still writes under ~.
SGLANG_CACHE_ENV = {
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "SGLANG_CACHE_DIR": f"{CACHE_DIR}/sglang",
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "HOME": f"{CACHE_DIR}/home",
}


def _sched(name: str, target: str, **select: str) -> Series:
    """A scheduler series: DP ranks summed, TP/PP/EP copies maxed, the priority="" total."""
    return Series(name, target, select={"priority": "", **select}, sum_over=("dp_rank",))


METRICS: Final = MetricTable(
    "sglang",
    (
        _sched("sglang:num_prefill_bootstrap_queue_reqs", "bootstrap_queue"),
        # The name of the same queue in builds before observability/metrics_collector.py.
        _sched("sglang:num_prefill_prealloc_queue_reqs", "bootstrap_queue"),
        _sched("sglang:num_prefill_inflight_queue_reqs", "inflight_queue"),
        _sched("sglang:num_decode_prealloc_queue_reqs", "prealloc_queue"),
        _sched("sglang:num_decode_transfer_queue_reqs", "transfer_queue"),
        _sched("sglang:num_running_reqs", "running"),
        _sched("sglang:num_queue_reqs", "waiting_queue"),
        _sched("sglang:gen_throughput", "throughput"),
        _sched("sglang:realtime_tokens_total", "generated_tokens", mode="decode"),
        # One per room whose real KV transfer succeeded; never a probe's (prefill.py:1250).
        _sched("sglang:kv_transfer_latency_ms_count", "kv_transfers"),
        _sched("sglang:num_bootstrap_failed_reqs_total", "failed"),
        _sched("sglang:num_transfer_failed_reqs_total", "failed"),
        # Tokenizer counter (finish-only on decode; on prefill a request finishes when its KV
        # transfer ends). Every label (is_streaming, priority, custom labels) partitions the
        # requests and the tokenizer workers' copies are already summed by prometheus-client's
        # multiprocess collector: sum every series.
        Series("sglang:num_requests_total", "completed", partitioned=True),
    ),
)
# Series a health-check request moves in SGLang 0.5.23 (see the module docstring): never read
# as progress. (name, label selection).
_STAGES: Final = "sglang:per_stage_req_latency_seconds_count"
PROBE_MOVED: Final[tuple[ProbeMoved, ...]] = (
    ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    ("sglang:realtime_tokens_total", {"mode": "prefill_cache"}),
    (_STAGES, {"stage": "prefill_bootstrap"}),
    (_STAGES, {"stage": "prefill_forward"}),
    (_STAGES, {"stage": "prefill_transfer_kv_cache"}),
    (_STAGES, {"stage": "decode_prepare"}),
    (_STAGES, {"stage": "decode_bootstrap"}),
    (_STAGES, {"stage": "decode_transferred"}),
    (_STAGES, {"stage": "fake_output"}),
    (_STAGES, {"stage": "quick_finish"}),
    ("sglang:queue_time_seconds_count", {}),
)
# Without a rooms API the narrowest repair of a wedged prefill is aborting all its requests,
# then (opt-in) restarting it: remediation/decide/rungs.py `abort_requests`. A prefill whose
# scheduler is frozen aborts nothing (the abort goes through that scheduler): it is restarted.
_PREFILL_WEDGES: Final = ("InflightStuck", "PeerIncarnationGone", "InflightGaugeStuck")
# The pair canary asks both sides' own /health at once (remediation/confirm/pair_canary.py,
# "health"): SGLang's PD legs go out together and wait on each other, so a leg without an
# answer names no side, while /health is answered by the scheduler loop itself, busy or idle
# (managers/scheduler.py: a busy scheduler acknowledges it at once, an idle one runs it), and
# turns 503 when no answer came within SGLANG_HEALTH_CHECK_TIMEOUT (20 s). Observed on the real
# pair (e2e/tests/test_sglang_real.py): a frozen prefill scheduler leaves every scheduler gauge
# of both pods at its last snapshot (the decode's showing requests running), so only asking
# tells which side stopped. The health checks move only PROBE_MOVED series. Beside them goes one
# PD request of one token (`kv_path`, as sgl-router sends it: the same body to both sides, the
# prefill's bootstrap address, a room): when it completes, the KV really moved. Sent with
# `log_metrics: false` (io_struct.py GenerateReqInput, as /health sends its own), the tokenizers
# count no finished request; the prefill observes its transfer all the same
# (disaggregation/prefill.py:1250-1255: only a fake bootstrap host is skipped), and the decode
# finishes it in the prebuilt batch without a decode step, like /health's. Measured on the real
# pair (e2e/tests/test_sglang_real.py), counter by counter: `effects`. One that does not complete
# (its transfer failed, or the prefill aborted it when our connection closed) is counted once
# as a bootstrap or a transfer failure on the prefill (disaggregation/prefill.py: a Failed poll
# and an aborted room both end in `increment_*_failed_reqs`): `failed_effects`.
PAIR_CANARY: Final = PairCanary(
    prefill_fields={},
    carried="",
    effects={"prefill": {"kv_transfers": 1}},
    path=SGLANG_HEALTH_PATH,
    protocol="health",
    kv_path="/generate",
    kv_fields={"sampling_params": {"max_new_tokens": 1, "temperature": 0}, "log_metrics": False},
    failed_effects={"prefill": {"failed": 1}},
)


@dataclass(frozen=True)
class SGLang:
    name: str = "sglang"
    metrics: MetricTable = METRICS
    probe_moved: tuple[ProbeMoved, ...] = PROBE_MOVED
    rooms_api: bool = False
    always_routed: bool = False  # sgl-router is optional: users often run their own
    bootstrap_key: bool = False  # SGLang's bootstrap server takes no key
    decode_lists_prefills: bool = False
    canary_confirms_decodes: bool = False
    pair_canary: PairCanary | None = PAIR_CANARY
    prefill_rungs: Mapping[str, PrefillRung] = field(
        default_factory=lambda: {
            **dict.fromkeys(_PREFILL_WEDGES, "abort_requests"),
            "PrefillDead": "restart_prefill",
            "TransfersFailing": "restart_failing_prefill",
        }
    )
    advisory_rules: tuple[AdviceRule, ...] = sglang_advice.RULES

    def worker_launch(self, spec: PDDeploymentSpec, role: str, deployment: str) -> Launch:
        pool = spec.prefill if role == ROLE_PREFILL else spec.decode
        model = spec.model
        command = [
            "python3", "-m", "sglang.launch_server",
            "--model-path", model.name,
            "--disaggregation-mode", role,
            "--disaggregation-transfer-backend", "nixl",
            "--disaggregation-bootstrap-port", str(spec.transfer.bootstrap_port),
            "--host", "$(POD_IP)",
            "--port", str(WORKER_PORT),
            "--tp-size", str(max(pool.gpus, 1)),
            "--enable-metrics",
        ]  # fmt: skip
        if model.served_name:
            command += ["--served-model-name", model.served_name]
        annotations = (
            {SGLANG_BOOTSTRAP_ANNOTATION: str(spec.transfer.bootstrap_port)}
            if role == ROLE_PREFILL
            else {}
        )
        return Launch(
            command=[*command, *pool.args],
            env={
                "SGLANG_DISAGGREGATION_NIXL_BACKEND": spec.transfer.nixl_backend,
                **SGLANG_CACHE_ENV,
            },
            annotations=annotations,
            probes=_probes(spec.sglang),
            volumes=_volumes(spec.sglang, pool.gpus),
            mounts=(
                {"name": "cache", "mountPath": CACHE_DIR},
                {"name": "dshm", "mountPath": SHM_DIR},
            ),
        )

    def needs_admin_token(self, spec: PDDeploymentSpec, role: str) -> bool:
        return role == ROLE_PREFILL  # the abort API (act/sglang_abort.py) takes the token

    def router_launch(self, spec: PDDeploymentSpec, deployment: str, namespace: str) -> Launch:
        prefill, decode = selector(deployment, ROLE_PREFILL), selector(deployment, ROLE_DECODE)
        return Launch(
            command=[
                "python3",
                "-m",
                "sglang_router.launch_router",
                "--pd-disaggregation",
                "--host",
                "$(POD_IP)",
                "--port",
                str(WORKER_PORT),
                "--service-discovery",
                "--service-discovery-namespace",
                namespace,
                "--prefill-selector",
                prefill.replace(",", " "),
                "--decode-selector",
                decode.replace(",", " "),
                "--service-discovery-port",
                str(WORKER_PORT),
                "--health-check-interval-secs",
                str(ROUTER_HEALTH_CHECK_SECONDS),
                *spec.router.args,
            ],
            probes=Probes(health_path="/health", ready_path="/health"),
        )

    def rooms_wait_for_decode_kv(self, pod: Obj, role: str) -> bool:
        if role != ROLE_PREFILL:
            return True
        return sglang_flags.rooms_wait_for_decode_kv(pod)

    def bootstrap_port(self, pod: Obj, role: str) -> int:
        return sglang_flags.bootstrap_port(pod) if role == ROLE_PREFILL else 0

    def advisories(self, pod: Obj) -> tuple[Advice, ...]:
        return sglang_advice.advisories(pod)


def _probes(knobs: SGLangSpec) -> Probes:
    return Probes(
        health_path=SGLANG_HEALTH_PATH,
        ready_path=SGLANG_READY_PATH,
        health_timeout=SGLANG_HEALTH_TIMEOUT_SECONDS,
        health_period=30,
        startup_path=SGLANG_READY_PATH,
        startup_period=SGLANG_STARTUP_PERIOD_SECONDS,
        startup_failures=-(-knobs.startup_timeout_seconds // SGLANG_STARTUP_PERIOD_SECONDS),
    )


def _volumes(knobs: SGLangSpec, gpus: int) -> tuple[dict[str, Any], ...]:
    claim = knobs.cache.persistent_volume_claim
    cache: dict[str, Any] = (
        {"name": "cache", "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {"name": "cache", "emptyDir": {"sizeLimit": knobs.cache.size_limit}}
    )
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size_for(knobs, gpus)}}
    return (cache, shm)


ENGINE: Final = SGLang()
