"""Host (CPU) KV memory on transparent huge pages.

Why: on CPU, NIXL's UCX backend moves KV with a CMA copy (`process_vm_writev`) that walks and
pins both processes' pages one by one, so the page size sets its pace. Measured on the 2-core
CI machine (THP in `madvise` mode, as most distributions ship it): a 256 MiB raw NIXL WRITE
between two processes moved 4.7-5.3 GB/s from 4 KiB pages and 10.9-11.9 GB/s from 2 MiB pages;
torch `copy_` went from 9.4 to 13.0 GB/s. torch's own allocator asks for huge pages only when
THP_MEM_ALLOC_ENABLE=1 is set, and then for every allocation; this asks only for the pool.

`zeros` maps anonymous memory aligned to 2 MiB, advises the kernel to back it with huge pages,
and touches it once so the pool is resident before the first transfer. Where the kernel refuses
(THP `never`, no MADV_HUGEPAGE), the same memory is plain 4 KiB pages: slower, still correct.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages) PMD size


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of `shape` on its own huge-page-advised mapping.

    The tensor keeps the mapping alive (torch.frombuffer holds the buffer it wraps), and its
    first byte is 2 MiB aligned, so every whole 2 MiB of it can be one huge page.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # THP off or unsupported: plain pages
            area.madvise(advice)
    whole = torch.frombuffer(area, dtype=torch.uint8)
    skip = -int(whole.data_ptr()) % HUGE_PAGE
    tensor = whole[skip : skip + nbytes].view(dtype).view(shape)
    tensor.zero_()  # fault it in now (as huge pages where granted), not during a transfer
    return tensor


def huge_page_bytes(tensor: torch.Tensor) -> int | None:
    """Bytes of huge pages backing the mapping that holds `tensor` (Linux /proc), or None where
    that cannot be read. For tests and diagnostics."""
    addr = int(tensor.data_ptr())
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, _, hi = head.partition("-")
            try:
                inside = int(lo, 16) <= addr < int(hi, 16)
            except ValueError:
                inside = False
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return None
