"""The KV geometries bench.kv_transfer moves, and the worker flags that give a worker each one.

Why apart: the timed processes (bench/_kv_rigs.py), the measuring loop and the report all need
the page, token and chunk sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Geometry:
    layers: int
    heads: int
    head_dim: int
    page_tokens: int
    dtype: str
    elem: int

    @property
    def token_bytes(self) -> int:
        return self.layers * 2 * self.heads * self.head_dim * self.elem

    @property
    def page_bytes(self) -> int:
        return self.token_bytes * self.page_tokens


# CPU: 2 heads x 16 dims x 32 layers, fp32, 64-token pages = 512 KiB pages, 8 KiB of KV per
# token, so 256 MiB is a 32768-token prompt. Small hidden size on purpose: the tiny model's
# forward costs little per KV byte.
CPU_GEOMETRY = Geometry(32, 2, 16, 64, "float32", 4)
# GPU: Llama-3-8B-like KV (32 layers, 8 KV heads x 128, bf16, 64-token pages): 128 KiB per
# token, 8 MiB pages, 1 GiB = 8192 tokens.
GPU_GEOMETRY = Geometry(32, 8, 128, 64, "bfloat16", 2)
CHUNK_BYTES = 32 * MIB  # the worker's default --chunk-bytes
FORWARD_GEOMETRY = ",".join(  # the initiator's --forward-geometry: the CPU worker's model
    str(getattr(CPU_GEOMETRY, f)) for f in ("layers", "heads", "head_dim", "page_tokens", "dtype")
)
GPU_ALT_CHUNK = 128 * MIB  # measured too on GPU: the transport with 4x bigger WRITEs
# Kept for readers of older JSON: the CPU page size.
PAGE_TOKENS, LAYERS, HEADS, HEAD_DIM = 64, 32, 2, 16
PAGE_BYTES = CPU_GEOMETRY.page_bytes
TOKEN_BYTES = CPU_GEOMETRY.token_bytes


def worker_flags(kv_pages: int, geo: Geometry = CPU_GEOMETRY, device: str = "cpu") -> list[str]:
    # Default heartbeats (2 s x 2) on purpose: the forward pass and KV checks run off the event
    # loop now, so a big room must not make decode declare a healthy prefill lost.
    return [
        "--layers", str(geo.layers), "--heads", str(geo.heads), "--head-dim", str(geo.head_dim),
        "--page-size", str(geo.page_tokens), "--dtype", geo.dtype, "--vocab", "1024",
        "--kv-pages", str(kv_pages), "--chunk-bytes", str(CHUNK_BYTES), "--device", device,
        "--waiting-timeout", "120", "--bootstrap-timeout", "120", "--inflight-timeout", "120",
        "--transfer-timeout", "30",
    ]  # fmt: skip
