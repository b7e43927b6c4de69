"""The `pdworker` command line: prefill, decode, router and load generator.

Every flag that the operator renders into a pod also reads an environment default (POD_IP,
POD_NAME, PDWORKER_ADMIN_TOKEN_FILE, PDWORKER_FAULTS, ...), and every flag is documented in
--help. Unknown options are an error that names the option (exit code 2).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import uuid
from collections.abc import Sequence

from pdworker import __version__
from pdworker import contract as c
from pdworker.config import DEFAULT_CHUNK_BYTES, DEFAULT_COMPUTE_THREADS
from pdworker.faults import FaultSpecError, parse_faults
from pdworker.limits import DEFAULT_MAX_ROOMS

EPILOG = (
    "Environment defaults: POD_IP (--host), POD_NAME (--pod-name), POD_NAMESPACE (--namespace), "
    f"PDWORKER_PORT (--port), PDWORKER_BOOTSTRAP_PORT (--bootstrap-port), {c.ADMIN_TOKEN_FILE_ENV} "
    f"(--admin-token-file), {c.BOOTSTRAP_TOKEN_FILE_ENV} (--bootstrap-token-file), {c.FAULTS_ENV} "
    "(--fault, comma separated), PDWORKER_LOG_LEVEL. "
    "Workers bound to a loopback --host set UCX_NET_DEVICES=lo unless it is already set, so "
    "NIXL/UCX listens on loopback only."
)


def _byte_size(text: str) -> int:
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


def _env(name: str, fallback: str) -> str:
    return os.environ.get(name, "").strip() or fallback


def _common(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument(
        "--host",
        default=_env("POD_IP", "127.0.0.1"),
        help="address to bind and advertise (default: $POD_IP or 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(_env("PDWORKER_PORT", str(default_port))),
        help=f"HTTP port (default: $PDWORKER_PORT or {default_port})",
    )
    p.add_argument(
        "--log-level",
        default=_env("PDWORKER_LOG_LEVEL", "INFO"),
        help="logging level (default: INFO)",
    )


def _worker_flags(p: argparse.ArgumentParser, role: str) -> None:
    _common(p, c.DEFAULT_HTTP_PORT)
    if role == "prefill":
        p.add_argument(
            "--bootstrap-port",
            type=int,
            default=int(_env("PDWORKER_BOOTSTRAP_PORT", str(c.DEFAULT_BOOTSTRAP_PORT))),
            help="bootstrap (handshake) port decode connects to "
            f"(default: $PDWORKER_BOOTSTRAP_PORT or {c.DEFAULT_BOOTSTRAP_PORT})",
        )
    p.add_argument(
        "--pod-name",
        default=_env("POD_NAME", socket.gethostname()),
        help="pod name, part of the incarnation and NIXL agent name (default: $POD_NAME)",
    )
    g = p.add_argument_group("model and KV pool (must match between prefill and decode)")
    g.add_argument("--layers", type=int, default=2, help="model layers (default: 2)")
    g.add_argument("--heads", type=int, default=4, help="KV heads (default: 4)")
    g.add_argument("--head-dim", type=int, default=32, help="head dimension (default: 32)")
    g.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default: 16)")
    g.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default: 4096)")
    g.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    g.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default="float32",
        help="KV dtype (default: float32)",
    )
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda[:N]")
    g.add_argument(
        "--kv-pages", type=int, default=4096, help="pages in the KV pool (default: 4096)"
    )
    g.add_argument(
        "--chunk-bytes",
        type=_byte_size,
        default=DEFAULT_CHUNK_BYTES,
        help="KV bytes per prefill chunk = per NIXL WRITE, rounded down to whole pages, at "
        "least one; suffixes KiB, MiB, GiB (default: 32MiB)",
    )
    g.add_argument(
        "--chunk-pages",
        type=int,
        default=0,
        help="pages per prefill chunk / NIXL WRITE; overrides --chunk-bytes (default: 0 = "
        "use --chunk-bytes)",
    )
    g.add_argument(
        "--kv-verify",
        choices=["full", "sample", "off"],
        default="sample",
        help="KV integrity check, computed on the pool's device: full (every page), sample "
        "(~1/32 of each room's pages, always the last one), off (default: sample)",
    )
    g.add_argument(
        "--compute-threads",
        type=int,
        default=DEFAULT_COMPUTE_THREADS,
        help="threads running forward passes, page scatter and KV checks off the event loop "
        f"(default: 2, or 1 on a host of 2 cores or fewer: here {DEFAULT_COMPUTE_THREADS})",
    )
    g.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (default: 1)")
    g.add_argument(
        "--prefill-chunk-ms",
        type=float,
        default=0.0,
        help="simulated forward time per prefill chunk, ms (default: 0)",
    )
    g.add_argument(
        "--decode-token-ms",
        type=float,
        default=0.0,
        help="simulated time per decoded token, ms (default: 0)",
    )
    g.add_argument(
        "--max-running",
        type=int,
        default=128,
        help="prefill forwards running at once (default: 128)",
    )
    t = p.add_argument_group("transfer and deadlines (seconds)")
    t.add_argument("--nixl-backend", default="UCX", help="NIXL backend plugin (default: UCX)")
    t.add_argument(
        "--transfer-threads",
        type=int,
        default=4,
        help="prefill transfer worker threads, sharded by room (default: 4)",
    )
    t.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=30.0,
        help="prefill: max wait for decode's handshake (default: 30)",
    )
    t.add_argument(
        "--waiting-timeout",
        type=float,
        default=30.0,
        help="decode: max wait for pages and for KV to arrive (default: 30)",
    )
    t.add_argument(
        "--inflight-timeout",
        type=float,
        default=30.0,
        help="prefill inflight watchdog, from entering the inflight queue (default: 30)",
    )
    t.add_argument(
        "--transfer-timeout",
        type=float,
        default=10.0,
        help="per-WRITE stall deadline for check_xfer_state polling (default: 10)",
    )
    t.add_argument(
        "--abort-ack-timeout",
        type=float,
        default=5.0,
        help="decode: max wait for prefill to acknowledge an abort (default: 5)",
    )
    t.add_argument(
        "--heartbeat-interval",
        type=float,
        default=2.0,
        help="decode -> prefill heartbeat interval (default: 2)",
    )
    t.add_argument(
        "--heartbeat-failures",
        type=int,
        default=2,
        help="decode: failed heartbeats before the prefill is lost (default: 2)",
    )
    t.add_argument(
        "--peer-timeout",
        type=float,
        default=10.0,
        help="prefill: silence after which a decode peer is lost (default: 10)",
    )
    a = p.add_argument_group("operations")
    a.add_argument(
        "--admin-token-file",
        default=_env(c.ADMIN_TOKEN_FILE_ENV, ""),
        help="file holding the admin API bearer token; without it the admin API "
        f"refuses every call (default: ${c.ADMIN_TOKEN_FILE_ENV})",
    )
    a.add_argument(
        "--bootstrap-token-file",
        default=_env(c.BOOTSTRAP_TOKEN_FILE_ENV, ""),
        help="file holding the deployment's bootstrap (handshake) key, the same on every "
        "prefill and decode of one deployment; without it prefill refuses every decode and "
        f"decode cannot register (default: ${c.BOOTSTRAP_TOKEN_FILE_ENV})",
    )
    a.add_argument(
        "--max-rooms",
        type=int,
        default=DEFAULT_MAX_ROOMS,
        help=f"rooms held at once; more requests get 429 (default: {DEFAULT_MAX_ROOMS})",
    )
    if role == "decode":
        a.add_argument(
            "--prefill-allow",
            default="",
            metavar="ADDR[,ADDR...]",
            help="bootstrap endpoints this decode may use, as ip:port or networks (CIDR), comma "
            "separated; empty: any endpoint that proves it holds the bootstrap key",
        )
    a.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="enable a production bug on purpose (repeatable, comma separated): "
        "legacy-status-race, no-inflight-watchdog, decode-stall[=N requests], "
        f"drop-notifications=P, corrupt-kv=P; also ${c.FAULTS_ENV}",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdworker",
        description="Reference prefill/decode KV-transfer worker (torch + NIXL).",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"pdworker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for role in ("prefill", "decode"):
        p = sub.add_parser(
            role, help=f"run a {role} worker", description=f"Run a {role} worker.", epilog=EPILOG
        )
        _worker_flags(p, role)
    r = sub.add_parser(
        "router",
        help="run the request router",
        epilog=EPILOG,
        description="Route POST /generate to a prefill and a decode concurrently.",
    )
    _common(r, c.DEFAULT_HTTP_PORT)
    r.add_argument("--prefill", default="", help="prefill URLs, comma separated (static discovery)")
    r.add_argument("--decode", default="", help="decode URLs, comma separated (static discovery)")
    r.add_argument(
        "--discovery",
        choices=["static", "kubernetes"],
        default="static",
        help="static (--prefill/--decode) or kubernetes (Ready pods by label selector)",
    )
    r.add_argument(
        "--namespace",
        default=_env("POD_NAMESPACE", "default"),
        help="kubernetes discovery: namespace (default: $POD_NAMESPACE or default)",
    )
    r.add_argument(
        "--prefill-selector",
        default="pdwarden.dev/role=prefill",
        help="kubernetes discovery: prefill pod label selector",
    )
    r.add_argument(
        "--decode-selector",
        default="pdwarden.dev/role=decode",
        help="kubernetes discovery: decode pod label selector",
    )
    r.add_argument(
        "--worker-port",
        type=int,
        default=c.DEFAULT_HTTP_PORT,
        help="kubernetes discovery: workers' HTTP port (default: 8000)",
    )
    r.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="deadline for one routed request, seconds (default: 600)",
    )
    ld = sub.add_parser(
        "load",
        help="run the load generator",
        epilog=EPILOG,
        description="Send concurrent requests to a router and summarise.",
    )
    ld.add_argument("--url", default=f"http://127.0.0.1:{c.DEFAULT_HTTP_PORT}", help="router URL")
    ld.add_argument("--clients", type=int, default=30, help="concurrent clients (default: 30)")
    ld.add_argument("--requests", type=int, default=None, help="total requests (default: 100)")
    ld.add_argument(
        "--duration",
        type=float,
        default=None,
        help="run for this many seconds instead of a request count",
    )
    ld.add_argument("--prompt-len", default="16:256", help="prompt tokens, N or LOW:HIGH (uniform)")
    ld.add_argument("--output-len", default="1:16", help="output tokens, N or LOW:HIGH (uniform)")
    ld.add_argument(
        "--cancel-fraction",
        type=float,
        default=0.0,
        help="fraction of requests cancelled at a random moment (default: 0)",
    )
    ld.add_argument(
        "--cancel-max-ms",
        type=float,
        default=200.0,
        help="cancellation moment is uniform in [0, this] ms (default: 200)",
    )
    ld.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    ld.add_argument("--vocab", type=int, default=4096, help="token ids are drawn below this")
    ld.add_argument("--seed", type=int, default=None, help="random seed")
    ld.add_argument("--json", default=None, metavar="PATH", help="also write the summary as JSON")
    return parser


def _worker_config(args: argparse.Namespace) -> object:
    from pdworker.config import WorkerConfig
    from pdworker.model import ModelConfig
    from pdworker.server import load_token

    faults = parse_faults([*args.fault, os.environ.get(c.FAULTS_ENV, "")])
    return WorkerConfig(
        role=args.command,
        host=args.host,
        port=args.port,
        bootstrap_port=getattr(args, "bootstrap_port", c.DEFAULT_BOOTSTRAP_PORT),
        pod=args.pod_name,
        model=ModelConfig(
            layers=args.layers,
            heads=args.heads,
            head_dim=args.head_dim,
            page_size=args.page_size,
            vocab=args.vocab,
            seed=args.seed,
            dtype=args.dtype,
        ),
        device=args.device,
        kv_pages=args.kv_pages,
        chunk_pages=args.chunk_pages,
        chunk_bytes=args.chunk_bytes,
        kv_verify=args.kv_verify,
        compute_threads=max(1, args.compute_threads),
        transfer_threads=args.transfer_threads,
        bootstrap_timeout=args.bootstrap_timeout,
        waiting_timeout=args.waiting_timeout,
        inflight_timeout=args.inflight_timeout,
        transfer_timeout=args.transfer_timeout,
        abort_ack_timeout=args.abort_ack_timeout,
        heartbeat_interval=args.heartbeat_interval,
        heartbeat_failures=args.heartbeat_failures,
        peer_timeout=args.peer_timeout,
        prefill_chunk_ms=args.prefill_chunk_ms,
        decode_token_ms=args.decode_token_ms,
        max_running=args.max_running,
        admin_token=load_token(args.admin_token_file),
        bootstrap_token=load_token(args.bootstrap_token_file, "bootstrap"),
        prefill_allow=tuple(a for a in getattr(args, "prefill_allow", "").split(",") if a.strip()),
        max_rooms=args.max_rooms,
        faults=faults,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Unknown options are named before a missing command is, so typos get a useful message.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("a COMMAND is required; see --help")
    logging.basicConfig(
        level=args.log_level.upper() if args.command != "load" else "WARNING",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command in ("prefill", "decode"):
        from pdworker.config import WorkerConfig
        from pdworker.prefill_link import parse_allow
        from pdworker.runner import run_worker

        try:
            cfg = _worker_config(args)
            assert isinstance(cfg, WorkerConfig)
            parse_allow(cfg.prefill_allow)
        except (FaultSpecError, ValueError) as exc:
            parser.error(str(exc))
        if cfg.max_rooms < 1:
            parser.error("--max-rooms must be >= 1")
        import torch

        torch.set_num_threads(max(1, args.torch_threads))
        asyncio.run(run_worker(cfg, nixl_backend=args.nixl_backend))
        return 0
    if args.command == "router":
        from pdworker.discovery import KubernetesDiscovery, StaticDiscovery, parse_endpoints
        from pdworker.runner import run_router

        discovery: StaticDiscovery | KubernetesDiscovery
        if args.discovery == "static":
            prefill, decode = parse_endpoints(args.prefill), parse_endpoints(args.decode)
            if not prefill or not decode:
                parser.error("static discovery needs --prefill and --decode URLs")
            discovery = StaticDiscovery(prefill, decode)
        else:
            discovery = KubernetesDiscovery(
                args.namespace, args.prefill_selector, args.decode_selector, args.worker_port
            )
        incarnation = f"router-{uuid.uuid4().hex[:12]}"
        asyncio.run(run_router(discovery, args.host, args.port, incarnation, args.request_timeout))
        return 0
    from pdworker.load import LoadConfig, format_summary, parse_range, run_load, write_json

    try:
        load_cfg = LoadConfig(
            url=args.url,
            clients=args.clients,
            requests=args.requests if args.requests is not None or args.duration else 100,
            duration=args.duration,
            prompt_len=parse_range(args.prompt_len),
            output_len=parse_range(args.output_len),
            cancel_fraction=args.cancel_fraction,
            cancel_max_ms=args.cancel_max_ms,
            timeout=args.timeout,
            seed=args.seed,
            vocab=args.vocab,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not 0.0 <= load_cfg.cancel_fraction <= 1.0 or load_cfg.clients < 1:
        parser.error("--cancel-fraction must be in [0, 1] and --clients >= 1")
    summary = asyncio.run(run_load(load_cfg))
    print(format_summary(summary))
    if args.json:
        write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
