"""Pod knobs and admission rules that only a stock vLLM pod needs (engine vllm).

Why its own module: a vLLM PD pod is `vllm serve` with the NixlConnector, whose knobs live in one
JSON flag (`--kv-transfer-config`) and two environment variables (the NIXL handshake side
channel); pdwarden sets those from the spec, so a copy in `args` would silently override them
(vLLM's argparse keeps the last of a repeated flag). Some flags break what pdwarden relies on:
`--disable-log-stats` removes every engine series from /metrics (v1/engine/async_llm.py:196
builds the StatLoggerManager, whose PrometheusStatLogger registers them, only with
log_stats), leaving detection blind. These are refused at admission, naming the field.
Checked against vLLM 0.32.0.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pdwarden.api.base import ApiModel, Rule, nested
from pdwarden.api.kube import Quantity
from pdwarden.api.sglang_knobs import CacheSpec

DEFAULT_STARTUP_SECONDS = 1800
DEFAULT_SHM_SIZE = "8Gi"

# Flags pdwarden puts on a vLLM worker's command line (engines/vllm.py), plus those that would
# break PD or detection. A spec that repeats one in prefill.args or decode.args is refused.
VLLM_OWNED_FLAGS: tuple[str, ...] = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--kv-transfer-config",
    "--tensor-parallel-size",
    "-tp",
    "--disable-log-stats",
)


class VLLMSpec(ApiModel):
    """Pod settings for engine vllm; ignored by other engines.

    Probes: startup, readiness and liveness all use vLLM's /health (200 while the engine core
    process lives, 503 once it died: entrypoints/serve/instrumentator/health.py). It runs no
    generation, so probes never move the progress counters detection reads.
    """

    cache: CacheSpec = nested(CacheSpec)
    shm_size: Quantity = Field(
        DEFAULT_SHM_SIZE,
        description=(
            "Size of the memory-backed emptyDir at /dev/shm (vLLM's inter-process message "
            "queues between API server, engine core and workers; NCCL with tensor parallelism). "
            "It counts against the pod's memory limit."
        ),
    )
    startup_timeout_seconds: int = Field(
        DEFAULT_STARTUP_SECONDS,
        ge=60,
        le=86400,
        description=(
            "How long a starting vLLM pod may take to answer /health (model download, weight "
            "loading, compilation) before the kubelet restarts it."
        ),
    )
    kv_buffer_device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description=(
            "Where the NixlConnector registers KV for transfer (kv_transfer_config "
            "kv_buffer_device): cuda on GPU nodes; cpu for vLLM's CPU build."
        ),
    )
    kv_load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description=(
            "What a decode does when its KV read from prefill fails (kv_transfer_config "
            "kv_load_failure_policy): recompute the prompt locally, so the client still gets an "
            "answer when pdwarden restarts a wedged prefill; fail answers the request with an "
            "error (vLLM's default)."
        ),
    )
    kv_lease_seconds: int | None = Field(
        None,
        ge=6,
        le=3600,
        description=(
            "How long a prefill keeps a request's KV for its decode (kv_connector_extra_config "
            "kv_lease_duration; vLLM's default 30 s when unset). The decode renews the lease "
            "every sixth of it, from its scheduler steps (nixl/base_scheduler.py:88), so on "
            "hardware where one step can take many seconds a short lease expires under healthy "
            "load: pdwarden then reports LeaseExpired."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()


def repeats_owned_flag(args: list[str]) -> bool:
    return any(a.split("=", 1)[0] in VLLM_OWNED_FLAGS for a in args)


def owned_flag_rule(pool: str) -> Rule:
    """A PDDeploymentSpec rule: engine vllm's pool args repeat none of VLLM_OWNED_FLAGS."""
    flags = ", ".join(f"'{f}'" for f in VLLM_OWNED_FLAGS)
    return Rule(
        cel=(
            f"self.engine != 'vllm' || !has(self.{pool}) || !has(self.{pool}.args) || "
            f"!self.{pool}.args.exists(a, a in [{flags}] || "
            f"[{flags}].exists(f, a.startsWith(f + '=')))"
        ),
        message=(
            f"{pool}.args must not repeat a flag pdwarden sets for vllm or one that breaks PD "
            f"or detection ({', '.join(VLLM_OWNED_FLAGS)}): set model, ports and the KV "
            "transfer through the spec (model, transfer, vllm), gpus for --tensor-parallel-size"
        ),
        field_path=f".{pool}.args",
        check=lambda s: s.engine != "vllm" or not repeats_owned_flag(getattr(s, pool).args),
    )
