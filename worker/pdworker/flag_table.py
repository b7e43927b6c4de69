"""Every flag of `pdworker prefill|decode|router|load`, one row each (the format is `flags`).

Rows are in --help order. A flag that two commands spell alike but mean differently (`--vocab`,
`--seed` of the workers and of the load generator) has a row per meaning. Worker flags the
operator renders into a pod read an environment default (POD_IP, POD_NAME, ...). Defaults that a
config dataclass also declares must agree with it (a test checks every row).
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from pdworker import contract as c
from pdworker.config import DEFAULT_CHUNK_BYTES, DEFAULT_COMPUTE_THREADS
from pdworker.flags import Command, Env, Flag
from pdworker.limits import DEFAULT_MAX_ROOMS
from pdworker.secret_file import DEFAULT_GRACE_S

DESCRIPTION = "Reference prefill/decode KV-transfer worker (torch + NIXL)."
EPILOG = (
    "Environment defaults: POD_IP (--host), POD_NAME (--pod-name), POD_NAMESPACE (--namespace), "
    f"PDWORKER_PORT (--port), PDWORKER_BOOTSTRAP_PORT (--bootstrap-port), {c.ADMIN_TOKEN_FILE_ENV} "
    f"(--admin-token-file), {c.BOOTSTRAP_TOKEN_FILE_ENV} (--bootstrap-token-file), {c.FAULTS_ENV} "
    "(--fault, comma separated), PDWORKER_LOG_LEVEL. "
    "Workers bound to a loopback --host set UCX_NET_DEVICES=lo unless it is already set, so "
    "NIXL/UCX listens on loopback only."
)
COMMAND_LIST = (
    Command("prefill", "run a prefill worker", "Run a prefill worker."),
    Command("decode", "run a decode worker", "Run a decode worker."),
    Command(
        "router",
        "run the request router",
        "Route POST /generate to a prefill and a decode concurrently.",
    ),
    Command(
        "load", "run the load generator", "Send concurrent requests to a router and summarise."
    ),
)
WORKERS = ("prefill", "decode")
SERVERS = ("prefill", "decode", "router")
PREFILL, DECODE, ROUTER, LOAD = ("prefill",), ("decode",), ("router",), ("load",)
MODEL = "model and KV pool (must match between prefill and decode)"
TRANSFER = "transfer and deadlines (seconds)"
OPS = "operations"


def byte_size(text: str) -> int:
    """`32MiB`, `4k`, `1g`, `512` -> bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20,
             "g": 1 << 30, "b": 1, "": 1}  # fmt: skip
    raw = text.strip().lower()
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        value = int(digits) * units[raw[len(digits) :].strip()]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 32MiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"byte size must be positive: {text!r}")
    return value


# -- converts: the flag's parsed value -> the config's (imports are lazy: `load` stays light) --
def _token(what: str) -> Any:
    def read(path: str) -> Any:
        from pdworker.secret_file import Secret

        return Secret(path, what=what)

    return read


def _allow(text: str) -> tuple[str, ...]:
    from pdworker.allow import parse_allow

    entries = tuple(a for a in text.split(",") if a.strip())
    parse_allow(entries)  # ValueError names a bad entry
    return entries


def _faults(values: list[str]) -> Any:
    from pdworker.faults import parse_faults

    return parse_faults([*values, os.environ.get(c.FAULTS_ENV, "")])


def _at_least_one(name: str) -> Any:
    def check(value: int) -> int:
        if value < 1:
            raise ValueError(f"{name} must be >= 1")
        return value

    return check


def _range(text: str) -> tuple[int, int]:
    from pdworker.load import parse_range

    return parse_range(text)


def _http_common(commands: tuple[str, ...]) -> list[Flag]:
    return [
        Flag("--host", None, Env("POD_IP", "127.0.0.1"),
             "address to bind and advertise (default: $POD_IP or 127.0.0.1)", commands, "host"),
        Flag("--port", int, Env("PDWORKER_PORT", c.DEFAULT_HTTP_PORT),
             f"HTTP port (default: $PDWORKER_PORT or {c.DEFAULT_HTTP_PORT})", commands, "port"),
        Flag("--log-level", None, Env("PDWORKER_LOG_LEVEL", "INFO"),
             "logging level (default: INFO)", commands),
    ]  # fmt: skip


FLAGS: tuple[Flag, ...] = (
    *_http_common(WORKERS),
    Flag("--bootstrap-port", int, Env("PDWORKER_BOOTSTRAP_PORT", c.DEFAULT_BOOTSTRAP_PORT),
         "bootstrap (handshake) port decode connects to "
         f"(default: $PDWORKER_BOOTSTRAP_PORT or {c.DEFAULT_BOOTSTRAP_PORT})",
         PREFILL, "bootstrap_port"),
    Flag("--pod-name", None, Env("POD_NAME", socket.gethostname),
         "pod name, part of the incarnation and NIXL agent name (default: $POD_NAME)",
         WORKERS, "pod"),
    # -- model and KV pool --
    Flag("--layers", int, 2, "model layers (default: 2)", WORKERS, "model.layers", MODEL),
    Flag("--heads", int, 4, "KV heads (default: 4)", WORKERS, "model.heads", MODEL),
    Flag("--head-dim", int, 32, "head dimension (default: 32)", WORKERS, "model.head_dim", MODEL),
    Flag("--page-size", int, 16, "tokens per KV page (default: 16)", WORKERS, "model.page_size",
         MODEL),
    Flag("--vocab", int, 4096, "vocabulary size (default: 4096)", WORKERS, "model.vocab", MODEL),
    Flag("--seed", int, 0, "weight seed (default: 0)", WORKERS, "model.seed", MODEL),
    Flag("--dtype", None, "float32", "KV dtype (default: float32)", WORKERS, "model.dtype", MODEL,
         choices=("float32", "float16", "bfloat16")),
    Flag("--device", None, "auto", "auto (CUDA if available), cpu or cuda[:N]", WORKERS, "device",
         MODEL),
    Flag("--kv-pages", int, 4096, "pages in the KV pool (default: 4096)", WORKERS, "kv_pages",
         MODEL),
    Flag("--chunk-bytes", byte_size, DEFAULT_CHUNK_BYTES,
         "KV bytes per prefill chunk = per NIXL WRITE, rounded down to whole pages, at least one; "
         "suffixes KiB, MiB, GiB (default: 32MiB)", WORKERS, "chunk_bytes", MODEL),
    Flag("--chunk-pages", int, 0,
         "pages per prefill chunk / NIXL WRITE; overrides --chunk-bytes (default: 0 = use "
         "--chunk-bytes)", WORKERS, "chunk_pages", MODEL),
    Flag("--kv-verify", None, "sample",
         "KV integrity check, computed on the pool's device: full (every page), sample (~1/32 of "
         "each room's pages, always the last one), off (default: sample)", WORKERS, "kv_verify",
         MODEL, choices=("full", "sample", "off")),
    Flag("--compute-threads", int, DEFAULT_COMPUTE_THREADS,
         "threads running forward passes, page scatter and KV checks off the event loop "
         f"(default: 2, or 1 on a host of 2 cores or fewer: here {DEFAULT_COMPUTE_THREADS})",
         WORKERS, "compute_threads", MODEL, convert=lambda n: max(1, n)),
    Flag("--torch-threads", int, 1, "torch CPU threads (default: 1)", WORKERS, None, MODEL),
    Flag("--prefill-chunk-ms", float, 0.0,
         "simulated forward time per prefill chunk, ms (default: 0)", WORKERS, "prefill_chunk_ms",
         MODEL),
    Flag("--decode-token-ms", float, 0.0, "simulated time per decoded token, ms (default: 0)",
         WORKERS, "decode_token_ms", MODEL),
    Flag("--max-running", int, 128, "prefill forwards running at once (default: 128)", WORKERS,
         "max_running", MODEL),
    # -- transfer and deadlines --
    Flag("--nixl-backend", None, "UCX", "NIXL backend plugin (default: UCX)", WORKERS, None,
         TRANSFER),
    Flag("--transfer-threads", int, 4,
         "prefill transfer worker threads, sharded by room (default: 4)", WORKERS,
         "transfer_threads", TRANSFER),
    Flag("--bootstrap-timeout", float, 30.0,
         "prefill: max wait for decode's handshake (default: 30)", WORKERS, "bootstrap_timeout",
         TRANSFER),
    Flag("--waiting-timeout", float, 30.0,
         "decode: max wait for pages and for KV to arrive (default: 30)", WORKERS,
         "waiting_timeout", TRANSFER),
    Flag("--inflight-timeout", float, 30.0,
         "prefill inflight watchdog, from entering the inflight queue (default: 30)", WORKERS,
         "inflight_timeout", TRANSFER),
    Flag("--transfer-timeout", float, 10.0,
         "per-WRITE stall deadline for check_xfer_state polling (default: 10)", WORKERS,
         "transfer_timeout", TRANSFER),
    Flag("--abort-ack-timeout", float, 5.0,
         "decode: max wait for prefill to acknowledge an abort (default: 5)", WORKERS,
         "abort_ack_timeout", TRANSFER),
    Flag("--heartbeat-interval", float, 2.0,
         "decode -> prefill heartbeat interval (default: 2)", WORKERS, "heartbeat_interval",
         TRANSFER),
    Flag("--heartbeat-failures", int, 2,
         "decode: failed heartbeats before the prefill is lost (default: 2)", WORKERS,
         "heartbeat_failures", TRANSFER),
    Flag("--peer-timeout", float, 10.0,
         "prefill: silence after which a decode peer is lost (default: 10)", WORKERS,
         "peer_timeout", TRANSFER),
    # -- operations --
    Flag("--admin-token-file", None, Env(c.ADMIN_TOKEN_FILE_ENV, ""),
         "file holding the admin API bearer token; without it the admin API refuses every call "
         f"(default: ${c.ADMIN_TOKEN_FILE_ENV})", WORKERS, "admin_token", OPS,
         convert=_token("admin")),
    Flag("--bootstrap-token-file", None, Env(c.BOOTSTRAP_TOKEN_FILE_ENV, ""),
         "file holding the deployment's bootstrap (handshake) key, the same on every prefill and "
         "decode of one deployment; without it prefill refuses every decode and decode cannot "
         f"register (default: ${c.BOOTSTRAP_TOKEN_FILE_ENV})", WORKERS, "bootstrap_token", OPS,
         convert=_token("bootstrap")),
    Flag("--secret-grace", float, DEFAULT_GRACE_S,
         "seconds a token or key replaced in its file (a rotated Secret) stays accepted after "
         f"this worker read the new one (default: {DEFAULT_GRACE_S:g})", WORKERS, "secret_grace",
         OPS),
    Flag("--max-rooms", int, DEFAULT_MAX_ROOMS,
         f"rooms held at once; more requests get 429 (default: {DEFAULT_MAX_ROOMS})", WORKERS,
         "max_rooms", OPS, convert=_at_least_one("--max-rooms")),
    Flag("--prefill-allow", None, "",
         "bootstrap endpoints this decode may dial, as ip:port or networks (CIDR), comma "
         "separated; with neither this nor --prefill-selector, decode dials no prefill",
         DECODE, "prefill_allow", OPS, convert=_allow, metavar="ADDR[,ADDR...]"),
    Flag("--prefill-selector", None, "",
         "label selector of this decode's prefill pods in --namespace: decode may dial the "
         "container port named 'bootstrap' of each Running one (needs pods list there)",
         DECODE, "prefill_selector", OPS),
    Flag("--namespace", None, Env("POD_NAMESPACE", "default"),
         "namespace of the --prefill-selector pods (default: $POD_NAMESPACE or default)", DECODE,
         "namespace", OPS),
    Flag("--fault", None, [],
         "enable a production bug on purpose (repeatable, comma separated): legacy-status-race, "
         "no-inflight-watchdog, decode-stall[=N requests], drop-notifications=P, corrupt-kv=P; "
         f"also ${c.FAULTS_ENV}", WORKERS, "faults", OPS, convert=_faults, metavar="NAME[=VALUE]",
         append=True),
    # -- the router --
    *_http_common(ROUTER),
    Flag("--prefill", None, "", "prefill URLs, comma separated (static discovery)", ROUTER,
         "prefill"),
    Flag("--decode", None, "", "decode URLs, comma separated (static discovery)", ROUTER,
         "decode"),
    Flag("--discovery", None, "static",
         "static (--prefill/--decode) or kubernetes (Ready pods by label selector)", ROUTER,
         "discovery", choices=("static", "kubernetes")),
    Flag("--namespace", None, Env("POD_NAMESPACE", "default"),
         "kubernetes discovery: namespace (default: $POD_NAMESPACE or default)", ROUTER,
         "namespace"),
    Flag("--prefill-selector", None, "pdwarden.dev/role=prefill",
         "kubernetes discovery: prefill pod label selector", ROUTER, "prefill_selector"),
    Flag("--decode-selector", None, "pdwarden.dev/role=decode",
         "kubernetes discovery: decode pod label selector", ROUTER, "decode_selector"),
    Flag("--worker-port", int, c.DEFAULT_HTTP_PORT,
         f"kubernetes discovery: workers' HTTP port (default: {c.DEFAULT_HTTP_PORT})", ROUTER,
         "worker_port"),
    Flag("--request-timeout", float, 600.0,
         "deadline for one routed request, seconds (default: 600)", ROUTER, "request_timeout"),
    Flag("--engine", None, "pdworker",
         "pdworker: POST /generate with bootstrap rooms; vllm: OpenAI /v1/completions and "
         "/v1/chat/completions through vLLM's PD protocol (prefill, then decode with its "
         "kv_transfer_params)", ROUTER, "engine", choices=("pdworker", "vllm")),
    # -- the load generator --
    Flag("--url", None, f"http://127.0.0.1:{c.DEFAULT_HTTP_PORT}", "router URL", LOAD, "url"),
    Flag("--clients", int, 30, "concurrent clients (default: 30)", LOAD, "clients"),
    Flag("--requests", int, None, "total requests (default: 100)", LOAD, "requests"),
    Flag("--duration", float, None, "run for this many seconds instead of a request count", LOAD,
         "duration"),
    Flag("--prompt-len", None, "16:256", "prompt tokens, N or LOW:HIGH (uniform)", LOAD,
         "prompt_len", convert=_range),
    Flag("--output-len", None, "1:16", "output tokens, N or LOW:HIGH (uniform)", LOAD,
         "output_len", convert=_range),
    Flag("--cancel-fraction", float, 0.0,
         "fraction of requests cancelled at a random moment (default: 0)", LOAD,
         "cancel_fraction"),
    Flag("--cancel-max-ms", float, 200.0,
         "cancellation moment is uniform in [0, this] ms (default: 200)", LOAD, "cancel_max_ms"),
    Flag("--timeout", float, 120.0, "per-request timeout, seconds", LOAD, "timeout"),
    Flag("--vocab", int, 4096, "token ids are drawn below this", LOAD, "vocab"),
    Flag("--seed", int, None, "random seed", LOAD, "seed"),
    Flag("--json", None, None, "also write the summary as JSON", LOAD, metavar="PATH"),
)  # fmt: skip
