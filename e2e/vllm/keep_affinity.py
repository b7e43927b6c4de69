"""Keep vLLM's NIXL connector from pinning an engine's model thread to one core, when asked by
environment.

Why: on a CPU platform, vLLM 0.32's NIXL worker "reserves the last core of each NUMA node for KV
transfer" by calling `os.sched_setaffinity(0, [last core])` from the Worker's main thread during
its init (distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py ~700-714), and that thread
then runs every model step. On a one-node box every engine's Worker lands on the same core: on
these 2-core machines the prefill's and the decode's Workers both ran on CPU 1 while CPU 0 sat
half idle, and their busy-polling shm_broadcast readers starved each other and everything else
on that core. Measured on the local cluster's pair under the tier's load: 0-1.6 generated
tokens/s, steps stalled for 20-40 s (the EngineCore then logs "No available shared memory
broadcast block found in 60 seconds"), a thread merely sleeping on CPU 1 left unscheduled for up
to 20 s; the same pair, the same load, after `taskset -pc 0,1` on the two Worker threads:
40-100 tokens/s and no stall. That was "stock vLLM's PD path hangs on this machine".

A GPU node never takes this path (it is for `device_type == "cpu"` only), so pdwarden renders
nothing for it; the local cluster's vLLM pods set PDWARDEN_VLLM_KEEP_AFFINITY=1. This module is
copied into the stock vLLM venv of the e2e tier (e2e/vllm/build.sh) with a .pth line that
imports it at interpreter start; vLLM's own code is never touched. When the variable is set,
`os.sched_setaffinity` called from vLLM's kv_connector package for the calling thread (pid 0)
leaves the affinity as it was and says so once on stderr; every other call goes through.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

ENV = "PDWARDEN_VLLM_KEEP_AFFINITY"
# Where the pinning call comes from (the module of the caller's frame).
PINNING_CALLER = "vllm.distributed.kv_transfer."


def guard(real: Callable[[int, Iterable[int]], None]) -> Callable[[int, Iterable[int]], None]:
    """`real` (os.sched_setaffinity), refusing the kv_connector's pinning of its own thread."""
    said: list[bool] = []

    def sched_setaffinity(pid: int, mask: Iterable[int]) -> None:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if pid == 0 and caller.startswith(PINNING_CALLER):
            if not said:
                said.append(True)
                print(f"[{ENV}] kept pid {os.getpid()}'s CPU affinity "
                      f"{sorted(os.sched_getaffinity(0))}: {caller} asked for {sorted(mask)}",
                      file=sys.stderr, flush=True)  # fmt: skip
            return
        real(pid, mask)

    return sched_setaffinity


def install(environ: Any = os.environ) -> bool:
    if environ.get(ENV, "").strip() not in ("1", "true"):
        return False
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity = guard(os.sched_setaffinity)
    return True


install()
