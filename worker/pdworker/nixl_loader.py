"""Load NIXL from whichever CUDA build of it is installed (nixl_cu13, nixl_cu12).

Why: the `nixl` meta package picks `nixl_cu13` or `nixl_cu12` by the CUDA it detects, but it
requires both wheels (~125 MB), so the CPU image installs only `nixl-cu12` and the CUDA 13 GPU
machines only `nixl-cu13`. This module does what the meta package does, without needing it: the
build matching torch's CUDA major first, then any other installed build. `PDWORKER_NIXL_MODULE`
names one explicitly (e.g. `nixl_cu12`).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

NIXL_MODULE_ENV = "PDWORKER_NIXL_MODULE"
BUILDS = ("nixl_cu13", "nixl_cu12")


class NixlUnavailable(ImportError):
    """No NIXL build could be imported."""


@dataclass(frozen=True)
class Nixl:
    """The NIXL API (`_api`) and bindings (`_bindings`, for its exception types) of one build."""

    module: str
    api: ModuleType
    bindings: ModuleType


def preferred_order(cuda_version: str | None, override: str = "") -> list[str]:
    """Which builds to try, in order: an override alone, else the torch CUDA major's build first."""
    if override:
        return [override]
    major = (cuda_version or "").split(".", 1)[0]
    first = f"nixl_cu{major}" if major else ""
    return [first, *(b for b in BUILDS if b != first)] if first in BUILDS else list(BUILDS)


def _torch_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return getattr(torch.version, "cuda", None)


def load_nixl() -> Nixl:
    errors = []
    for name in preferred_order(_torch_cuda(), os.environ.get(NIXL_MODULE_ENV, "").strip()):
        try:
            api = importlib.import_module(f"{name}._api")
            bindings = importlib.import_module(f"{name}._bindings")
        except (ImportError, OSError) as exc:  # OSError: a build whose CUDA libs are absent
            errors.append(f"{name}: {exc}")
            continue
        return Nixl(name, api, bindings)
    raise NixlUnavailable("no NIXL build importable (" + "; ".join(errors) + ")")
