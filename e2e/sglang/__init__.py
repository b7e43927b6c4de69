"""Stock SGLang (CPU) for the e2e tier: where its venv lives, how to get it.

Why: the SGLang tier runs real `python3 -m sglang.launch_server` processes and the stock
`sglang_router`, which need a venv of their own (SGLang pins a torch neither the project nor the
vLLM tier uses). It is built once into the cache outside the repository (`build.sh`, pinned by
`versions.env` and `requirements.lock`) and reused warm; the model is the vLLM tier's tiny one
(e2e/vllm/tinymodel.py). `cpu_image/` holds what only a CPU box needs, installed into that venv.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from e2e import enginevenv
from e2e.enginevenv import cache_root

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.env"
LOCK_FILE = HERE / "requirements.lock"


def versions() -> dict[str, str]:
    return enginevenv.read_versions(VERSIONS_FILE)


def venv_dir() -> Path:
    """Where build.sh puts the venv (same formula as the script: the versions and the lock's
    hash, so a new lock is a new venv)."""
    v = versions()
    key = hashlib.sha256(VERSIONS_FILE.read_bytes() + LOCK_FILE.read_bytes()).hexdigest()[:12]
    name = f"sglang-{v['SGLANG_VERSION']}-torch-{v['TORCH_VERSION']}-nixl-{v['NIXL_VERSION']}-{key}"
    return cache_root() / name


def venv_ready(venv: Path | None = None) -> bool:
    return enginevenv.ready(venv or venv_dir(), "python")


def ensure_venv(timeout: float = 3600) -> Path:
    """Build (or reuse) the venv (e2e/enginevenv.py `build`)."""
    return enginevenv.build(BUILD_SCRIPT, timeout)
