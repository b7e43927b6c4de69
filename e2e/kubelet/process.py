"""One container = one process group, started with a parent-death signal and a pid file.

Why: a container's processes must die with it. Each process leads its own session (so `killpg`
reaches its children), asks the kernel to SIGKILL it if the kubelet dies (PR_SET_PDEATHSIG), and
leaves a pid file so a restarted kubelet can reap groups that survived a hard kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .memcg import MemoryCgroup

log = logging.getLogger("kubelet.process")

MARKER_ENV = "PDWARDEN_KUBELET_POD_UID"
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup(cgroup: MemoryCgroup | None) -> Callable[[], None]:
    def setup() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cgroup is not None:
            cgroup.enter()  # before exec: the container's first byte is charged to its limit

    return setup


def _open_log(log_path: Path) -> BinaryIO:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return open(log_path, "ab", buffering=0)


def _write_pid(pid_file: Path, pid: int) -> None:
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(pid))


async def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    log_path: Path,
    pid_file: Path,
    *,
    cgroup: MemoryCgroup | None = None,
) -> asyncio.subprocess.Process:
    """Start argv as the leader of a new session, stdout+stderr appended to log_path, inside
    `cgroup` when given."""
    with _open_log(log_path) as out:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_child_setup(cgroup),
        )
    _write_pid(pid_file, proc.pid)
    return proc


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the group, SIGKILL after `grace` seconds; always reap the leader."""
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), max(grace, 0.0))
        except TimeoutError:
            log.info("pid %d ignored SIGTERM for %.0fs: SIGKILL", proc.pid, grace)
    signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


def exit_code(returncode: int) -> int:
    """Container-runtime convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def marked_groups(uid_marker: bytes = MARKER_ENV.encode()) -> set[int]:
    """Process groups with a member started by a local kubelet (found via the env marker)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pgid = int(stat.read_text().rsplit(")", 1)[1].split()[2])
            environ = (stat.parent / "environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if uid_marker in environ:
            groups.add(pgid)
    return groups


def reap_stale(state_dir: Path) -> int:
    """Kill process groups recorded by an earlier kubelet that did not exit cleanly.

    The group survives its leader (PR_SET_PDEATHSIG only reaches the direct child), so a group
    is matched by any live member carrying the kubelet's env marker.
    """
    pid_files = list(state_dir.glob("pods/*/*/*/pids/*.pid"))
    if not pid_files:
        return 0
    live = marked_groups()
    killed = 0
    for pid_file in pid_files:
        try:
            pgid = int(pid_file.read_text())
        except (OSError, ValueError):
            pgid = -1
        if pgid in live:
            signal_group(pgid, signal.SIGKILL)
            killed += 1
        pid_file.unlink(missing_ok=True)
    return killed
