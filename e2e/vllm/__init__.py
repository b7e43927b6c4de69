"""Stock vLLM (CPU build) for the e2e tier: where its venv and tiny model live, how to get them.

Why: the vLLM tier runs real `vllm serve` processes, which need a venv of their own (vLLM pins a
torch the project's worker does not use) and a model directory (nothing may come from a model
hub). Both are built once into the cache outside the repository (like the control plane's
binaries) and reused warm: `build.sh` makes the venv, `tinymodel.py` the model. The pinned
versions live in `versions.env`, read by both the shell and this module.
"""

from __future__ import annotations

from pathlib import Path

from e2e import enginevenv
from e2e.enginevenv import cache_root

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.env"
# The image repository the local kubelet maps onto the venv's `vllm` (e2e/kubelet/images.py).
IMAGE_SUFFIX = "vllm-openai"
# Environment a vLLM process needs here so it never reaches for a hub or phones home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def versions() -> dict[str, str]:
    return enginevenv.read_versions(VERSIONS_FILE)


def venv_dir() -> Path:
    """Where build.sh puts the venv (same formula as the script)."""
    v = versions()
    name = f"vllm-{v['VLLM_VERSION']}-torch-{v['TORCH_VERSION']}-nixl-{v['NIXL_VERSION']}"
    return cache_root() / name


def venv_ready(venv: Path | None = None) -> bool:
    return enginevenv.ready(venv or venv_dir(), "vllm")


def ensure_venv(timeout: float = 3600) -> Path:
    """Build (or reuse) the venv (e2e/enginevenv.py `build`)."""
    return enginevenv.build(BUILD_SCRIPT, timeout)
