"""Stock SGLang (CPU) for the e2e tier: where its venv lives, how to get it.

Why: the SGLang tier runs real `python3 -m sglang.launch_server` processes and the stock
`sglang_router`, which need a venv of their own (SGLang pins a torch neither the project nor the
vLLM tier uses). It is built once into the cache outside the repository (`build.sh`, pinned by
`versions.env` and `requirements.lock`) and reused warm; the model is the vLLM tier's tiny one
(e2e/vllm/tinymodel.py). `cpu_image/` holds what only a CPU box needs, installed into that venv.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.env"
LOCK_FILE = HERE / "requirements.lock"
# The image repository the local kubelet maps onto this venv's python (e2e/kubelet/images.py).
IMAGE_SUFFIX = "sglang"


def versions() -> dict[str, str]:
    """`versions.env` as a dict (KEY=VALUE lines, # comments)."""
    out: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    return Path(os.environ.get("PDWARDEN_CACHE") or Path.home() / ".cache" / "pdwarden")


def venv_dir() -> Path:
    """Where build.sh puts the venv (same formula as the script: the versions and the lock's
    hash, so a new lock is a new venv)."""
    v = versions()
    key = hashlib.sha256(VERSIONS_FILE.read_bytes() + LOCK_FILE.read_bytes()).hexdigest()[:12]
    name = f"sglang-{v['SGLANG_VERSION']}-torch-{v['TORCH_VERSION']}-nixl-{v['NIXL_VERSION']}-{key}"
    return cache_root() / name


def venv_ready(venv: Path | None = None) -> bool:
    venv = venv or venv_dir()
    return (venv / ".pdwarden-complete").exists() and os.access(venv / "bin" / "python", os.X_OK)


def ensure_venv(timeout: float = 3600) -> Path:
    """Build (or reuse) the venv; raise RuntimeError with the build's tail if it fails. The
    script runs even for a finished venv: it refreshes the CPU image's pieces there."""
    out = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({out.returncode}): {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])
