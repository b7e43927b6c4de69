"""A real SGLang prefill/decode pair for the local cluster, as a PDDeployment with `engine: sglang`.

Why: the SGLang tier deploys stock `lmsysorg/sglang` pods (the local kubelet runs them from the
cached CPU venv, e2e/sglang) that pdwarden renders itself, with the stock `sglang_router` in PD
mode finding them through the Kubernetes API. What a CPU server needs beyond a GPU one is all
here, in the spec, never in what pdwarden renders:

* SGLang's own flags for a CPU server (`CPU_ARGS`): `--device cpu` (a pool with `gpus: 0` must
  say so), `--attention-backend torch_native` (the x86 default needs kernel ops), float32,
  a 4096-token KV pool, no CUDA graphs, no overlap scheduling, and `--sleep-on-idle` (an idle PD
  scheduler otherwise spins a whole core: measured 99 % each, the pair 2 cores of this box's 2).
  The decode's retraction backup calls cudaHostRegister: `--disaggregation-decode-retraction-
  backup none` (`DECODE_ARGS`).
* `SGLANG_HOST_IP=$(POD_IP)`: without it SGLang advertises the machine's first non-loopback
  address as its bootstrap and NIXL host (utils/network.py), which is not the pod's here.
* What only this box needs (`LOCAL_ENV`): the CPU engine switch, one OpenMP thread and one NIXL
  thread per server, UCX on loopback, an offline hub, and the test image's two hooks
  (e2e/sglang/cpu_image: KV pool memory given to NIXL as host memory; NIXL's progress thread
  sleeping in poll()).
The model is the vLLM tier's tiny one, made at test time.
"""

from __future__ import annotations

from typing import Any

from e2e.sglang.cpu_image.nixl_host_memory import ENV as HOST_MEMORY_ENV
from e2e.vllm import OFFLINE_ENV
from e2e.vllm.nixl_progress_delay import ENV as PROGRESS_DELAY_ENV
from pdwarden.constants import API_VERSION, KIND, WORKER_PORT

IMAGE = "lmsysorg/sglang:v0.5.23"
HTTP_PORT = WORKER_PORT  # pdwarden renders SGLang's --port as every worker's
BOOTSTRAP_PORT = 8998
SERVED_NAME = "tiny"
CPU_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--dtype", "float32",
    "--max-total-tokens", "4096",
    "--context-length", "1024",
    "--max-running-requests", "8",
    "--disable-overlap-schedule",
    "--disable-cuda-graph",
    "--sleep-on-idle",
]  # fmt: skip
DECODE_ARGS = ["--disaggregation-decode-retraction-backup", "none"]
CPU_ENV = {"SGLANG_HOST_IP": "$(POD_IP)"}
LOCAL_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "OMP_NUM_THREADS": "1",
    "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": '{"num_threads":"1"}',
    "UCX_NET_DEVICES": "lo",
    HOST_MEMORY_ENV: "1",
    PROGRESS_DELAY_ENV: "1000",
    **OFFLINE_ENV,
}
STARTUP_SECONDS = 1200  # a server Ready: 66 s on a quiet box, minutes on a busy one


def pd_deployment(model_dir: str, name: str = "pd", **remediation: Any) -> dict[str, Any]:
    """`engine: sglang`, one prefill and one decode on CPU, the stock router in PD mode."""
    env = [{"name": k, "value": v} for k, v in {**CPU_ENV, **LOCAL_ENV}.items()]

    def pool(args: list[str]) -> dict[str, Any]:
        return {"replicas": 1, "gpus": 0, "args": args, "env": env}

    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "engine": "sglang",
            "image": IMAGE,
            # A host path: the local kubelet runs processes without a mount namespace.
            "model": {"name": model_dir, "servedName": SERVED_NAME},
            "transfer": {"bootstrapPort": BOOTSTRAP_PORT},
            "prefill": pool(CPU_ARGS),
            "decode": pool(CPU_ARGS + DECODE_ARGS),
            "router": {"replicas": 1},
            "sglang": {
                "startupTimeoutSeconds": STARTUP_SECONDS,
                "cache": {"sizeLimit": "2Gi"},
                "shmSize": "1Gi",
            },
            "remediation": remediation,
        },
    }
