"""A stock engine's venv in the cache outside the repository: its pins, its path, its build.

Why one module: the vLLM and SGLang tiers each build a venv of their own with a shell script
(`e2e/<engine>/build.sh`) from pinned versions (`versions.env`, KEY=VALUE lines read by the
shell and by Python), cache it under ~/.cache/pdwarden keyed by those pins, and mark it complete
only once it works; the tier's package says only where its files are and how its folder is named.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DONE = ".pdwarden-complete"


def read_versions(path: Path) -> dict[str, str]:
    """A `versions.env` as a dict (KEY=VALUE lines, # comments)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    return Path(os.environ.get("PDWARDEN_CACHE") or Path.home() / ".cache" / "pdwarden")


def ready(venv: Path, program: str) -> bool:
    """The venv was built to the end and has `program` (bin/...)."""
    return (venv / DONE).exists() and os.access(venv / "bin" / program, os.X_OK)


def build(script: Path, timeout: float = 3600) -> Path:
    """Run the tier's build script (it reuses a finished venv and refreshes its shims) and
    return the venv it prints; RuntimeError with the build's tail if it fails."""
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=timeout,
                         check=False)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed ({out.returncode}): {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])
