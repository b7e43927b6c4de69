"""Pod knobs that only a stock SGLang pod needs: writable caches, /dev/shm, startup window.

Why its own module: pdwarden's pods run as a non-root user with a read-only root filesystem, so
an SGLang container can write only where the pod mounts a volume. SGLang 0.5.23 writes model
downloads under HF_HOME and compiled kernels under SGLANG_CACHE_DIR (srt/environ.py:
`SGLANG_CACHE_DIR`, `third_party_cache_defaults`), NCCL needs a /dev/shm larger than the
container runtime's 64 MiB default for tensor parallelism, and a first start may spend many
minutes downloading weights. These knobs say how big and where, and `kubectl explain` documents
them; pdworker pods ignore them.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pdwarden.api.base import ApiModel, Rule, nested
from pdwarden.api.kube import MAX_NAME, Quantity

DEFAULT_CACHE_SIZE = "100Gi"
DEFAULT_SHM_PER_GPU_GI = 8
MIN_SHM_GI = 2
DEFAULT_STARTUP_SECONDS = 1800
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class CacheSpec(ApiModel):
    """Where an SGLang pod writes model downloads and compiled kernels.

    Mounted at /cache: HF_HOME=/cache/huggingface, SGLANG_CACHE_DIR=/cache/sglang (SGLang points
    Triton, Inductor, CUDA, TileLang and FlashInfer caches below it), XDG_CACHE_HOME=/cache/xdg
    and HOME=/cache/home. By default a per-pod emptyDir of sizeLimit; with
    persistentVolumeClaim, an existing claim shared by every SGLang pod (it must allow the access
    mode your pods need, e.g. ReadWriteMany for more than one node).
    """

    size_limit: Quantity = Field(
        DEFAULT_CACHE_SIZE,
        description=(
            "sizeLimit of the per-pod emptyDir cache; the kubelet evicts a pod that writes more. "
            "Leave room for the model weights plus compiled kernels."
        ),
    )
    persistent_volume_claim: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_NAME,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=(
            "Name of an existing PersistentVolumeClaim in the PDDeployment's namespace to use "
            "instead of the emptyDir, so downloads survive pod restarts. sizeLimit is then unused."
        ),
    )


class SGLangSpec(ApiModel):
    """Pod settings for engine sglang; ignored by pdworker pods.

    Probes: readiness and startup use SGLang's /ready (200 once the server finished warm-up and is
    not paused; no generation is run); liveness uses /health, which runs a one-token generation
    when the server is idle, with a timeout above SGLang's own 20 s health-check timeout.
    """

    cache: CacheSpec = nested(CacheSpec)
    shm_size: Quantity | None = Field(
        None,
        description=(
            "Size of the memory-backed emptyDir mounted at /dev/shm (NCCL and SGLang's own "
            "inter-process buffers). Default: "
            f"{DEFAULT_SHM_PER_GPU_GI}Gi per GPU of the pool, at least {MIN_SHM_GI}Gi. It counts "
            "against the pod's memory limit."
        ),
    )
    startup_timeout_seconds: int = Field(
        DEFAULT_STARTUP_SECONDS,
        ge=60,
        le=86400,
        description=(
            "How long a starting SGLang pod may take to answer /ready (model download, weight "
            "loading, CUDA graph capture) before the kubelet restarts it. Liveness probes start "
            "only after the pod answered once."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()


def shm_size_for(spec: SGLangSpec, gpus: int) -> int | str:
    """The /dev/shm size of a pod with `gpus` GPUs."""
    if spec.shm_size is not None:
        return spec.shm_size
    return f"{max(MIN_SHM_GI, DEFAULT_SHM_PER_GPU_GI * gpus)}Gi"
