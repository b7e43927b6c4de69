"""A tiny but real model and a paged KV pool, so the worker moves KV that was computed from tokens.

The model is an embedding plus per-layer K/V projections (no cross-token mixing in prefill, so
chunked prefill is exact). Weights come from a seed, so prefill, decode and tests build identical
models. The pool is one contiguous tensor of pages ([pages, layers, K/V, page_size, heads,
head_dim]) so each page is one contiguous NIXL descriptor; it lives on CUDA when available, and
on CPU on transparent huge pages (`hostmem`).
"""

from __future__ import annotations

import hashlib
import math

import torch

from pdworker import hostmem
from pdworker.config import ModelConfig
from pdworker.pages import PagePool

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
__all__ = ["KVPool", "ModelConfig", "TinyModel", "kv_checksum", "page_runs", "pick_device"]


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class TinyModel:
    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        gen = torch.Generator().manual_seed(cfg.seed)
        h = cfg.hidden
        scale = 1.0 / math.sqrt(h)
        dtype = DTYPES[cfg.dtype]
        self.embed = (torch.randn(cfg.vocab, h, generator=gen) * 0.5).to(device, dtype)
        self.wk = (torch.randn(cfg.layers, h, h, generator=gen) * scale).to(device, dtype)
        self.wv = (torch.randn(cfg.layers, h, h, generator=gen) * scale).to(device, dtype)
        self.wo = (torch.randn(cfg.layers, h, h, generator=gen) * scale).to(device, dtype)

    @torch.inference_mode()
    def prefill_chunk(self, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """KV for these tokens, shape [layers, 2, n, heads, head_dim], and the last hidden state."""
        cfg = self.cfg
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device) % cfg.vocab
        x = self.embed[ids]
        n = len(token_ids)
        out = torch.empty(
            cfg.layers, 2, n, cfg.heads, cfg.head_dim, dtype=x.dtype, device=self.device
        )
        for layer in range(cfg.layers):
            out[layer, 0] = (x @ self.wk[layer]).view(n, cfg.heads, cfg.head_dim)
            out[layer, 1] = (x @ self.wv[layer]).view(n, cfg.heads, cfg.head_dim)
            x = torch.tanh(x @ self.wo[layer])
        return out, x[-1]

    @torch.inference_mode()
    def prefill_into(self, pool: KVPool, pages: list[int], token_ids: list[int]) -> torch.Tensor:
        """`prefill_chunk` writing each layer's K/V straight into the pool pages; returns the
        last hidden state. Same operations, same bytes, but the KV is written to memory once
        (no [layers, 2, n, ...] temporary and no second scatter pass): on CPU the forward pass
        otherwise costs more memory traffic than the KV transfer it feeds."""
        cfg = self.cfg
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device) % cfg.vocab
        x = self.embed[ids]
        n = len(token_ids)
        for layer in range(cfg.layers):
            k = (x @ self.wk[layer]).view(n, cfg.heads, cfg.head_dim)
            v = (x @ self.wv[layer]).view(n, cfg.heads, cfg.head_dim)
            pool.write_layer(pages, layer, k, v)
            x = torch.tanh(x @ self.wo[layer])
        return x[-1]

    @torch.inference_mode()
    def first_token(self, last_hidden: torch.Tensor) -> int:
        return int(torch.argmax(self.embed @ last_hidden).item())

    @torch.inference_mode()
    def decode_step(self, kv: torch.Tensor, token: int) -> int:
        """One attention step of the last layer over the transferred KV; returns the next token."""
        cfg = self.cfg
        keys = kv[-1, 0].reshape(kv.shape[2], cfg.hidden)
        values = kv[-1, 1].reshape(kv.shape[2], cfg.hidden)
        q = self.embed[token % cfg.vocab] @ self.wk[-1]
        att = torch.softmax(keys @ q / math.sqrt(cfg.hidden), dim=0)
        return int(torch.argmax(self.embed @ torch.tanh(att @ values @ self.wo[-1])).item())

    def prefill(self, token_ids: list[int]) -> tuple[torch.Tensor, int]:
        """Whole-prompt KV and first token (tests use it to check what decode received)."""
        kv, last = self.prefill_chunk(token_ids)
        return kv, self.first_token(last)


def kv_checksum(kv: torch.Tensor) -> str:
    """Exact host checksum of KV bytes (tests); the worker uses integrity.fingerprint instead."""
    data = kv.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class KVPool:
    """The worker's paged KV memory, registered with NIXL once at start."""

    def __init__(self, cfg: ModelConfig, num_pages: int, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        shape = (num_pages, cfg.layers, 2, cfg.page_size, cfg.heads, cfg.head_dim)
        dtype = DTYPES[cfg.dtype]
        if device.type == "cpu":  # on huge pages: CMA and copies run about twice as fast
            self.tensor = hostmem.zeros(shape, dtype)
        else:
            self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.pages = PagePool(num_pages)

    @property
    def num_pages(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def mem_type(self) -> str:
        return "VRAM" if self.device.type == "cuda" else "DRAM"

    @property
    def device_id(self) -> int:
        # The GPU the pool really lives on: a bare "cuda" device has no index, and
        # `device.index or 0` would name GPU 0 even when the current device is another one.
        return int(self.tensor.get_device()) if self.tensor.is_cuda else 0

    @property
    def base_addr(self) -> int:
        return int(self.tensor.data_ptr())

    def page_descs(self) -> list[tuple[int, int, int]]:
        size = self.cfg.page_bytes
        return [(self.base_addr + i * size, size, self.device_id) for i in range(self.num_pages)]

    def write_tokens(self, pages: list[int], kv: torch.Tensor) -> None:
        """Scatter KV [layers, 2, n, heads, head_dim] into `pages` (n <= len(pages)*page_size).

        Full pages are copied run by run (consecutive page indices are one strided copy, no
        padded temporary); the unused tail of the last page is zeroed, so a page's bytes depend
        only on its tokens (the integrity fingerprint covers whole pages). Asynchronous on CUDA:
        order NIXL after it with `ordering.Ordering.fence()`.
        """
        size = self.cfg.page_size
        n = int(kv.shape[2])
        full = min(n // size, len(pages))
        for pos, first, count in page_runs(pages[:full]):
            src = kv[:, :, pos * size : (pos + count) * size].unflatten(2, (count, size))  # type: ignore[no-untyped-call]
            self.tensor[first : first + count].copy_(src.permute(2, 0, 1, 3, 4, 5))
        for pos in range(full, len(pages)):
            page = self.tensor[pages[pos]]
            used = max(0, min(size, n - pos * size))
            if used:
                page[:, :, :used].copy_(kv[:, :, pos * size : pos * size + used])
            page[:, :, used:].zero_()

    def write_layer(self, pages: list[int], layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """One layer's K and V [n, heads, head_dim] into `pages` (tails zeroed as write_tokens)."""
        size = self.cfg.page_size
        n = int(k.shape[0])
        full = min(n // size, len(pages))
        for kv_index, src in ((0, k), (1, v)):
            for pos, first, count in page_runs(pages[:full]):
                rows = src[pos * size : (pos + count) * size].unflatten(0, (count, size))  # type: ignore[no-untyped-call]
                self.tensor[first : first + count, layer, kv_index].copy_(rows)
            for pos in range(full, len(pages)):
                page = self.tensor[pages[pos], layer, kv_index]
                used = max(0, min(size, n - pos * size))
                if used:
                    page[:used].copy_(src[pos * size : pos * size + used])
                page[used:].zero_()

    def read_tokens(
        self, pages: list[int], n_tokens: int, layers: slice | None = None
    ) -> torch.Tensor:
        """KV [layers, 2, n, heads, head_dim] of `pages` (a copy); `layers` picks some layers."""
        cfg = self.cfg
        idx = torch.tensor(pages, dtype=torch.long, device=self.device)
        src = self.tensor[idx] if layers is None else self.tensor[idx, layers]
        got = src.permute(1, 2, 0, 3, 4, 5)
        got = got.reshape(got.shape[0], 2, len(pages) * cfg.page_size, cfg.heads, cfg.head_dim)
        return got[:, :, :n_tokens]


def page_runs(pages: list[int]) -> list[tuple[int, int, int]]:
    """(position in `pages`, first page, count) for each run of consecutive page indices."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for end in range(1, len(pages) + 1):
        if end == len(pages) or pages[end] != pages[end - 1] + 1:
            runs.append((start, pages[start], end - start))
            start = end
    return runs
