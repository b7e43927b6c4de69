"""Where the worker's heavy torch work runs: a small thread pool, one CUDA stream per thread.

Why: forward passes, page scatter/gather and KV fingerprints on the asyncio event loop stall
heartbeats and the bootstrap endpoints (healthy peers were declared lost under load). Torch
releases the GIL inside its kernels, so a thread keeps the loop responsive on CPU; on GPU each
thread gets its own stream so rooms' kernels can overlap, and all hand-offs between threads go
through `ordering.Fence`s.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch


def _init_thread(device: torch.device, torch_threads: int) -> None:
    # OpenMP thread counts are per thread: without this a new thread uses every core, which
    # both oversubscribes the machine and changes float reduction order (results would differ
    # from the same computation on the main thread).
    torch.set_num_threads(torch_threads)
    if device.type == "cuda":
        device = indexed(device)
        torch.cuda.set_device(device)  # refuses a bare "cuda" (no index): hence indexed()
        torch.cuda.synchronize(device)  # weights and pool made on the default stream are ready
        torch.cuda.set_stream(torch.cuda.Stream(device))  # type: ignore[no-untyped-call]


def indexed(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:<current>`; other devices unchanged."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def compute_executor(threads: int, device: torch.device) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        max_workers=max(1, threads),
        thread_name_prefix="compute",
        initializer=_init_thread,
        initargs=(device, torch.get_num_threads()),
    )
