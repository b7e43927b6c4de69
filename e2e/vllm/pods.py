"""A real vLLM prefill/decode pair for the local cluster, as a PDDeployment with `engine: vllm`.

Why: the vLLM tier deploys stock `vllm/vllm-openai` pods (the local kubelet runs them from the
cached CPU venv) that pdwarden renders itself, with its router in vLLM mode. The pods get what
only a CPU box needs (float32, eager mode, a 1 GiB KV
cache, cpu KV buffers, no CPU pinning (vLLM's OpenMP binding off, its NIXL worker's core pinning
kept off by keep_affinity.py), offline hub, the NIXL progress-thread delay) from here,
never from what pdwarden renders for GPU clusters; the model is the tiny one made at test time.
The startup window fits a cold start on two busy cores (measured 1.5-7 min for the pair).
"""

from __future__ import annotations

from typing import Any

from e2e.vllm import OFFLINE_ENV
from e2e.vllm.keep_affinity import ENV as KEEP_AFFINITY_ENV
from e2e.vllm.nixl_progress_delay import ENV as PROGRESS_DELAY_ENV
from pdwarden.constants import API_VERSION, KIND, WORKER_PORT

IMAGE = "vllm/vllm-openai:v0.32.0"
HTTP_PORT = WORKER_PORT  # pdwarden renders vLLM's --port as every worker's
SIDE_CHANNEL_PORT = 5600
SERVED_NAME = "tiny"
ROLES = ("prefill", "decode")
# Poll timeout of NIXL's progress thread (nixl_progress_delay.py): 1 ms instead of a spin.
PROGRESS_DELAY_US = "1000"
CPU_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: the smallest it takes
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    PROGRESS_DELAY_ENV: PROGRESS_DELAY_US,
    KEEP_AFFINITY_ENV: "1",  # both engines' model threads on one core starve each other
    **OFFLINE_ENV,
}
STARTUP_SECONDS = 1200  # both pods Ready: measured 1.5-7 min, with room to spare
# vLLM's 30 s KV lease is renewed from the decode's scheduler steps, and one step took up to
# ~28 s here under healthy load: CI saw the prefill free a lease (and the decode then read the
# freed blocks) with two client loops. A two-core box gets a lease a GPU node never needs.
KV_LEASE_SECONDS = 180


def pd_deployment(model_dir: str, name: str = "pd", **remediation: Any) -> dict[str, Any]:
    """`engine: vllm`, one prefill and one decode, the router in vLLM mode."""
    env = [{"name": k, "value": v} for k, v in CPU_ENV.items()]
    pool = {"replicas": 1, "gpus": 0, "args": CPU_ARGS, "env": env}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "engine": "vllm",
            "image": IMAGE,
            # A host path: the local kubelet runs processes without a mount namespace.
            "model": {"name": model_dir, "servedName": SERVED_NAME},
            "transfer": {"bootstrapPort": SIDE_CHANNEL_PORT},
            "prefill": pool,
            "decode": pool,
            "router": {"replicas": 1},
            "vllm": {
                "kvBufferDevice": "cpu",
                "kvLoadFailurePolicy": "recompute",
                "kvLeaseSeconds": KV_LEASE_SECONDS,
                "startupTimeoutSeconds": STARTUP_SECONDS,
                "cache": {"sizeLimit": "2Gi"},
                "shmSize": "1Gi",
            },
            "remediation": remediation,
        },
    }
