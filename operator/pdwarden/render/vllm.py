"""The command line, environment, volumes and probes of a stock vLLM prefill or decode pod.

Why its own module: a vLLM PD pod is `vllm serve MODEL` with the NixlConnector configured in one
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
"""

from __future__ import annotations

import json

from pdwarden.api import PDDeploymentSpec
from pdwarden.api.vllm import VLLMSpec
from pdwarden.constants import ROLE_PREFILL
from pdwarden.render.common import WORKER_PORT
from pdwarden.render.launch import CACHE_DIR, SHM_DIR, Launch, Probes

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


def vllm_worker(spec: PDDeploymentSpec, role: str, gpus: int, args: list[str]) -> Launch:
    model, knobs = spec.model, spec.vllm
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
