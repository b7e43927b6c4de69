"""The processes a local cluster owns: whether a recorded PID still runs, and how one is ended.

Why apart: the control plane (controlplane.py) and the pod-CIDR claims (octets.py) both read PIDs
from a cluster's state file and must agree on what "alive" means; a stop signals the whole
process group and reaps it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time

STATE_FILE = "state.json"


class ClusterError(RuntimeError):
    """The control plane could not be started or reached; the message says which part and why."""


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
