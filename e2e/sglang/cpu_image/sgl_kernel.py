"""A pure-torch `sgl_kernel` for the SGLang tier's CPU image: the two ops SGLang's CPU path calls.

Why: with SGLANG_USE_CPU_ENGINE=1, SGLang 0.5.23 imports two CPU ops from `sgl_kernel` at module
level (kernels/ops/kvcache/cache_move.py `copy_all_layer_kv_cache_cpu`, mem_cache/allocation.py
`assign_req_to_token_pool_cpu`), and some modules on the import path import more names that the
CPU path never calls. PyPI's only sgl-kernel is a CUDA build (ImportError: libcuda.so.1) and the
CPU build needs the PyTorch index and a compiler toolchain this machine lacks. This package is
written here from what those call sites need; it is installed into the tier's venv by
e2e/sglang/build.sh (never into anything a GPU user runs). Every other name is a function that
raises NotImplementedError if called, so a path that would need a real kernel fails loudly.
Without `torch.ops.sgl_kernel` SGLang keeps its torch-native paths (kernels/fused_op.py
`_platform_key`), and `--attention-backend torch_native` keeps attention off kernel ops.
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "0.0.0+pdwarden.cpu"


def assign_req_to_token_pool_cpu(  # noqa: PLR0917  SGLang's call passes six positionals
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Request i's next `end-start` slots of `out_cache_loc`, in order, into its row of
    `req_to_token` at columns start..end."""
    del pool_len  # the row width; rows are indexed directly
    taken = 0
    for i in range(int(req_pool_indices.numel())):
        start, end = int(start_offset[i]), int(end_offset[i])
        n = end - start
        row = int(req_pool_indices[i])
        req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For each layer buffer (base address, row stride in bytes), copy row src_loc[j] to row
    tgt_loc[j]; every source row is read before any is written, so overlapping moves are safe."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64).tolist()
    tgt = tgt_loc.to(torch.int64).tolist()
    rows = max(*src, *tgt) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buf = _bytes_at(int(ptr), rows * int(stride)).view(rows, int(stride))
        buf[tgt] = buf[src].clone()


def _bytes_at(address: int, size: int) -> torch.Tensor:
    """A uint8 view of `size` bytes of this process's memory at `address` (a KV pool buffer)."""
    import ctypes

    array = (ctypes.c_uint8 * size).from_address(address)
    return torch.frombuffer(array, dtype=torch.uint8, count=size)


def _missing(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name}: the SGLang tier's CPU image has only the ops its CPU path "
            f"calls (e2e/sglang/cpu_image/sgl_kernel.py)"
        )

    call.__name__ = name
    return call


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
