"""What a container runs, whatever the engine: command, environment, probes, volumes.

Why a module: every engine module builds Launches and the renderer (render/pods.py) turns one
into a pod template; the type and the shared mount points sit below both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CACHE_DIR = "/cache"
SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Probes:
    """Probe paths and timings of the main container."""

    health_path: str = "/healthz"
    ready_path: str = "/readyz"
    health_timeout: int = 2
    health_period: int = 10
    startup_path: str | None = None  # None: the health path
    startup_period: int = 2
    startup_failures: int = 150


@dataclass(frozen=True)
class Launch:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    probes: Probes = field(default_factory=Probes)
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
