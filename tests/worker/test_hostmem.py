"""hostmem: the CPU KV pool lives on its own zeroed, 2 MiB aligned, huge-page-advised mapping."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

from pdworker import hostmem
from pdworker.model import KVPool, ModelConfig

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_allowed() -> bool:
    """THP in `always` or `madvise` mode: an madvised mapping may get huge pages."""
    try:
        mode = THP.read_text()
    except OSError:
        return False
    return "[never]" not in mode


def test_zeros_is_a_zeroed_aligned_writable_tensor_that_owns_its_mapping() -> None:
    t = hostmem.zeros((3, 5, 7), torch.float32)
    gc.collect()  # nothing but the tensor refers to the mapping now
    assert t.shape == (3, 5, 7) and t.dtype == torch.float32 and t.device.type == "cpu"
    assert t.is_contiguous() and int(t.data_ptr()) % hostmem.HUGE_PAGE == 0
    assert not t.any()
    t.fill_(2.5)
    assert float(t.sum()) == 2.5 * 3 * 5 * 7
    assert hostmem.zeros((0, 4), torch.float32).numel() == 0


@pytest.mark.skipif(not thp_allowed(), reason="transparent huge pages are off on this host")
def test_a_cpu_kv_pool_is_backed_by_huge_pages() -> None:
    cfg = ModelConfig(layers=4, heads=2, head_dim=16, page_size=64)  # 64 KiB pages
    pool = KVPool(cfg, 128, torch.device("cpu"))  # 8 MiB
    huge = hostmem.huge_page_bytes(pool.tensor)
    assert huge is not None and huge >= hostmem.HUGE_PAGE, huge
    if "[madvise]" in THP.read_text() and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        # The control: in madvise mode torch's own allocator gets none.
        plain = torch.zeros(pool.tensor.shape, dtype=pool.tensor.dtype)
        assert hostmem.huge_page_bytes(plain) in (0, None)
