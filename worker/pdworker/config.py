"""Settings shared by the prefill and decode roles, built once from the command line.

Torch-free on purpose: the router and the load generator import it and must start fast.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pdworker import contract as c
from pdworker.faults import Faults
from pdworker.limits import DEFAULT_MAX_ROOMS, MAX_PROMPT_TOKENS
from pdworker.secret_file import DEFAULT_GRACE_S, Secret
from pdworker.server import BadRequest

MAX_TOKEN_ID = 2**31
# One prefill chunk = one NIXL WRITE. 32 MiB: on an H200 one WRITE reaches ~0.5x of its 1 GiB
# rate from 64 MiB and pays ~0.1 ms fixed cost per WRITE, while chunks must stay small enough
# that the forward of chunk k+1 overlaps the WRITE of chunk k (bench/kv_transfer).
DEFAULT_CHUNK_BYTES = 32 << 20
# Compute threads: two, but never every core. On a 2-core host two busy forward threads left the
# event loop no core of its own: under the full 30-client kv_storm, health p99 measured 109-137 ms
# with two threads and 91 ms with one (load 6-18, same day; bench/README.md).
DEFAULT_COMPUTE_THREADS = max(1, min(2, (os.cpu_count() or 1) - 1))
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 2
    heads: int = 4
    head_dim: int = 32
    page_size: int = 16
    vocab: int = 4096
    seed: int = 0
    dtype: str = "float32"

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def page_bytes(self) -> int:
        elem = DTYPE_BYTES[self.dtype]
        return self.layers * 2 * self.page_size * self.hidden * elem

    def pages_for(self, tokens: int) -> int:
        return max(1, math.ceil(tokens / self.page_size))

    def layout(self) -> dict[str, Any]:
        """What both sides must agree on before bytes can move (checked at handshake)."""
        out = asdict(self)
        out["page_bytes"] = self.page_bytes
        return out


@dataclass
class WorkerConfig:
    role: str
    host: str = "127.0.0.1"
    port: int = c.DEFAULT_HTTP_PORT
    bootstrap_port: int = 8998
    pod: str = field(default_factory=socket.gethostname)
    model: ModelConfig = field(default_factory=ModelConfig)
    device: str = "auto"
    kv_pages: int = 4096
    chunk_pages: int = 0  # 0: derived from chunk_bytes
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    kv_verify: str = "sample"
    compute_threads: int = DEFAULT_COMPUTE_THREADS
    transfer_threads: int = 4
    bootstrap_timeout: float = 30.0
    waiting_timeout: float = 30.0
    inflight_timeout: float = 30.0
    transfer_timeout: float = 10.0
    abort_ack_timeout: float = 5.0
    heartbeat_interval: float = 2.0
    heartbeat_failures: int = 2
    peer_timeout: float = 10.0
    prefill_chunk_ms: float = 0.0
    decode_token_ms: float = 0.0
    max_running: int = 128
    poll_interval: float = 0.005
    # Token files, read again when the kubelet rewrites them (a plain string: a fixed value).
    admin_token: Secret = field(default_factory=Secret)
    bootstrap_token: Secret = field(default_factory=Secret)  # the handshake key (both roles)
    secret_grace: float = DEFAULT_GRACE_S  # a replaced token stays accepted this long
    prefill_allow: tuple[str, ...] = ()  # decode: bootstrap endpoints (host:port) or networks
    prefill_selector: str = ""  # decode: label selector of its deployment's prefill pods
    namespace: str = "default"  # decode: where those pods are
    max_rooms: int = DEFAULT_MAX_ROOMS
    faults: Faults = field(default_factory=Faults)
    incarnation: str = ""

    def __post_init__(self) -> None:
        self.admin_token = Secret.of(self.admin_token, "admin")
        self.bootstrap_token = Secret.of(self.bootstrap_token, "bootstrap")
        for secret in (self.admin_token, self.bootstrap_token):
            secret.grace_s = self.secret_grace
        if not self.incarnation:
            pod = self.pod.replace("_", "-") or "pod"
            self.incarnation = f"{self.role}-{pod}-{uuid.uuid4().hex[:12]}"

    @property
    def pages_per_chunk(self) -> int:
        """Pages per prefill chunk (= per NIXL WRITE): --chunk-pages, else --chunk-bytes."""
        if self.chunk_pages > 0:
            return self.chunk_pages
        return max(1, self.chunk_bytes // self.model.page_bytes)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RouterConfig:
    """`pdworker router`'s settings (defaults: flag_table, the only place they are written)."""

    host: str
    port: int
    prefill: str  # static discovery: URLs, comma separated
    decode: str
    discovery: str  # static | kubernetes
    namespace: str
    prefill_selector: str
    decode_selector: str
    worker_port: int
    request_timeout: float
    engine: str  # pdworker | vllm: which PD protocol the router speaks


def parse_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not value or len(value) > MAX_PROMPT_TOKENS:
        raise BadRequest("input_ids must be a non-empty list of token ids")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < MAX_TOKEN_ID:
            raise BadRequest(f"input_ids must hold integers in [0, {MAX_TOKEN_ID})")
    return value


def parse_positive_int(body: dict[str, Any], key: str, default: int, limit: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise BadRequest(f"{key} must be an integer in [1, {limit}]")
    return value
