"""Fault injection into a real SGLang pod of the local cluster, from outside: signals only.

Why signals: real hangs, never a patched SGLang. A `python3 -m sglang.launch_server` pod here is
one session (the local kubelet starts each container in its own): the leader runs the HTTP server
and the tokenizer manager, and it spawns the scheduler (`sglang::scheduler`, which also runs the
disaggregation queues, the bootstrap and the NIXL agent) and the detokenizer. Stopping the
scheduler alone is "the scheduler frozen": /health's generation and /metrics' scheduler gauges
stop, while the HTTP server still accepts requests. Processes are found by session
(e2e/vllm/faults.py `pod_processes`: SGLang's setproctitle hides the kubelet's env marker too).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from e2e.vllm.faults import pod_processes

SCHEDULER_TITLE = b"sglang::scheduler"


def scheduler_processes(uid: str) -> list[int]:
    """The pod's scheduler process(es), by the title SGLang gives them."""
    found = []
    for pid in pod_processes(uid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(SCHEDULER_TITLE):
                found.append(pid)
    assert found, f"pod {uid} has no {SCHEDULER_TITLE.decode()} process"
    return found


def freeze_scheduler(uid: str) -> list[int]:
    """SIGSTOP the pod's scheduler; returns its pids."""
    pids = scheduler_processes(uid)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def kill_server(uid: str) -> list[int]:
    """SIGKILL every process of the pod (the whole server dies, as with an OOM kill)."""
    pids = pod_processes(uid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
