"""KV integrity that costs little: an exact fingerprint of pool pages, made on their device.

Why: prefill and decode must prove the KV bytes arrived unchanged (the check caught the missing
GPU ordering), but a host checksum of the whole KV (device-to-host copy plus blake2b) costs more
than the transfer itself. A fingerprint here is integer arithmetic with torch ops where the pool
lives: each page's bytes are read as integer words and summed (int64, wrapping), and the page
sums are weighted by odd per-position factors. Integer sums are exact and order independent,
so the value is the same on any device and any reduction order; one changed byte changes one
word by a nonzero multiple of 2^(8k) < 2^64, which an odd weight keeps nonzero mod 2^64, so any
single flipped byte in a fingerprinted page is always caught, and the position weights catch
pages swapped or written to the wrong place.

Modes (`--kv-verify`): `full` fingerprints every page of a room; `sample` (the default) a
seeded random subset of about 1/SAMPLE_EVERY of the pages, always at least one and always the
last (partial) page, so a one-page room is checked completely; `off` checks nothing. Prefill
chooses the seed and sends it inside the checksum string `<mode>.<k>.<seed>.<hex>`; decode
recomputes over the same pages and compares. The string has no ':' (the notification codec's
separator), so the meta notification keeps its shape.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

VERIFY_MODES = ("full", "sample", "off")
DEFAULT_VERIFY = "sample"
SAMPLE_EVERY = 32  # sample mode reads ~1/32 of a room's pages (one read pass, no copies)
OFF = "off"
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Spec:
    """What to fingerprint: `count` pages chosen by `seed` (count == pages: all of them)."""

    mode: str
    count: int
    seed: int

    def indices(self, npages: int) -> list[int]:
        return sample_indices(npages, self.count, self.seed) if self.mode == "sample" else []


def sample_indices(npages: int, count: int, seed: int) -> list[int]:
    """`count` distinct positions in [0, npages), always including the last one, sorted."""
    count = max(1, min(count, npages))
    if count >= npages:
        return list(range(npages))
    chosen = set(random.Random(seed).sample(range(npages - 1), count - 1))
    chosen.add(npages - 1)
    return sorted(chosen)


def plan(mode: str, npages: int, rng: random.Random | None = None) -> Spec:
    if mode not in VERIFY_MODES:
        raise ValueError(f"kv-verify must be one of {', '.join(VERIFY_MODES)} (got {mode!r})")
    if mode == "sample":
        count = max(1, -(-npages // SAMPLE_EVERY))
        if count >= npages:
            return Spec("full", npages, 0)
        return Spec("sample", count, (rng or random).getrandbits(48))
    return Spec(mode, npages if mode == "full" else 0, 0)


def positions(spec: Spec, npages: int) -> list[int]:
    if spec.mode == "full":
        return list(range(npages))
    return spec.indices(npages)


def _words(pool: torch.Tensor) -> torch.Tensor:
    """The pool as [pages, words] of the widest integer type dividing a page."""
    flat = pool.view(pool.shape[0], -1).view(torch.uint8)
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if flat.shape[1] % size == 0:
            return flat.view(dtype)
    return flat


def fingerprint(pool: torch.Tensor, pages: Sequence[int], picks: Sequence[int]) -> int:
    """Exact fingerprint of pool pages `pages[i]` for i in `picks` (torch ops, on pool's device).

    Contiguous page runs are summed as views (no gather copy); one small device-to-host read of
    the result is the only synchronisation.
    """
    if not picks:
        return 0
    words = _words(pool)
    chosen = [pages[i] for i in picks]
    sums = []
    start = 0
    for end in range(1, len(chosen) + 1):
        if end == len(chosen) or chosen[end] != chosen[end - 1] + 1:
            first = chosen[start]
            sums.append(words[first : first + (end - start)].sum(dim=1, dtype=torch.int64))
            start = end
    per_page = torch.cat(sums) if len(sums) > 1 else sums[0]
    weights = torch.tensor([2 * i + 1 for i in picks], dtype=torch.int64, device=per_page.device)
    return int((per_page * weights).sum().item()) & MASK64


def encode(spec: Spec, value: int) -> str:
    if spec.mode == OFF:
        return OFF
    return f"{spec.mode}.{spec.count}.{spec.seed}.{value:016x}"


def decode_spec(text: str) -> Spec | None:
    """Parse a checksum string into its spec; None for `off` or anything malformed."""
    parts = text.split(".")
    if len(parts) != 4 or parts[0] not in ("full", "sample"):
        return None
    try:
        count, seed = int(parts[1]), int(parts[2])
        int(parts[3], 16)
    except ValueError:
        return None
    return Spec(parts[0], count, seed) if count > 0 and seed >= 0 else None


def checksum(pool: torch.Tensor, pages: Sequence[int], spec: Spec) -> str:
    """The string prefill sends and decode recomputes."""
    if spec.mode == OFF:
        return OFF
    return encode(spec, fingerprint(pool, pages, positions(spec, len(pages))))
