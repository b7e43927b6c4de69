"""Fault injection into a real vLLM pod of the local cluster, from outside: signals only.

Why signals: the issue asks for real hangs, never a patched vLLM. A `vllm serve` pod here is a
process group (the local kubelet starts each container in its own session): its leader is the
API server, its other members the EngineCore and Worker processes that vLLM spawns. Stopping
every member but the leader is "the engine frozen behind a live API server": /health and
/metrics keep answering (research: a hung engine keeps /health 200), no step runs, and the
Worker's NIXL agent no longer serves the reads a decode posts against its blocks.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from e2e.kubelet.process import MARKER_ENV


def _session(pid: int) -> int | None:
    """The session id of a live process (/proc/PID/stat, the field after the pgrp)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[3])
    return None


def pod_processes(uid: str) -> list[int]:
    """Live processes of the pod with this uid: every process in the sessions of those that
    carry the kubelet's env marker.

    The marker alone misses vLLM's engine: EngineCore and Worker call setproctitle, which
    reuses the memory behind /proc/PID/environ for their long titles (measured: their environ
    reads as 1297 lines of the title and no marker). Every container leads its own session
    (e2e/kubelet/process.py) and vLLM never starts one, so the session is the container."""
    marker = f"{MARKER_ENV}={uid}".encode()
    sessions: set[int] = set()
    every: dict[int, int] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        sid = _session(pid)
        if sid is None:
            continue
        every[pid] = sid
        with contextlib.suppress(OSError):
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                sessions.add(sid)
    return sorted(pid for pid, sid in every.items() if sid in sessions)


def engine_processes(uid: str) -> list[int]:
    """The pod's engine processes: every member of its process group but the API server."""
    engine = [pid for pid in pod_processes(uid) if os.getpgid(pid) != pid]
    assert engine, f"pod {uid} has no engine process besides its API server"
    return engine


def kill_engine(uid: str) -> list[int]:
    """SIGKILL the pod's engine processes (an engine crash: the API server is left alive)."""
    engine = engine_processes(uid)
    for pid in engine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return engine


def freeze_engine(uid: str) -> list[int]:
    """SIGSTOP the pod's engine processes (every member but the API server, the group leader);
    returns their pids. AssertionError if the pod has no engine process to freeze."""
    engine = engine_processes(uid)
    for pid in engine:
        os.kill(pid, signal.SIGSTOP)
    return engine


def thaw(pids: list[int]) -> None:
    """SIGCONT what is still there (a restarted pod's processes are gone)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
