"""The `pdworker` command line: prefill, decode, router and load generator.

The flags are data (`flag_table`, built by `flags`): this module only parses, turns the parsed
flags into each command's config and starts it. Every flag that the operator renders into a pod
also reads an environment default (POD_IP, POD_NAME, PDWORKER_ADMIN_TOKEN_FILE, PDWORKER_FAULTS,
...), and every flag is documented in --help. Unknown options and bad values are an error that
names the option (exit code 2).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from pdworker.flag_table import COMMAND_LIST, DESCRIPTION, EPILOG, FLAGS
from pdworker.flags import build_parser as _build
from pdworker.flags import config_fields


def build_parser() -> argparse.ArgumentParser:
    return _build(FLAGS, COMMAND_LIST, DESCRIPTION, EPILOG)


def worker_config(args: argparse.Namespace) -> Any:
    """The WorkerConfig of `pdworker prefill|decode`; ValueError names a bad flag value."""
    from pdworker.config import ModelConfig, WorkerConfig

    fields = config_fields(FLAGS, args.command, args)
    return WorkerConfig(role=args.command, model=ModelConfig(**fields.pop("model")), **fields)


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
        return _worker(parser, args)
    if args.command == "router":
        return _router(parser, args)
    return _load(parser, args)


def _worker(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from pdworker.runner import run_worker

    try:
        cfg = worker_config(args)
    except ValueError as exc:  # FaultSpecError too
        parser.error(str(exc))
    import torch

    torch.set_num_threads(max(1, args.torch_threads))
    asyncio.run(run_worker(cfg, nixl_backend=args.nixl_backend))
    return 0


def _router(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from pdworker.config import RouterConfig
    from pdworker.discovery import KubernetesDiscovery, StaticDiscovery, parse_endpoints
    from pdworker.runner import run_router

    cfg = RouterConfig(**config_fields(FLAGS, "router", args))
    discovery: StaticDiscovery | KubernetesDiscovery
    if cfg.discovery == "static":
        prefill, decode = parse_endpoints(cfg.prefill), parse_endpoints(cfg.decode)
        if not prefill or not decode:
            parser.error("static discovery needs --prefill and --decode URLs")
        discovery = StaticDiscovery(prefill, decode)
    else:
        discovery = KubernetesDiscovery(
            cfg.namespace, cfg.prefill_selector, cfg.decode_selector, cfg.worker_port
        )
    incarnation = f"router-{uuid.uuid4().hex[:12]}"
    serving = run_router(
        discovery, cfg.host, cfg.port, incarnation, cfg.request_timeout, engine=cfg.engine
    )
    asyncio.run(serving)
    return 0


def _load(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from pdworker.load import LoadConfig, format_summary, run_load, write_json

    try:
        fields = config_fields(FLAGS, "load", args)
    except ValueError as exc:
        parser.error(str(exc))
    if fields["requests"] is None and not fields["duration"]:
        fields["requests"] = 100  # a request count unless a duration is given
    cfg = LoadConfig(**fields)
    if not 0.0 <= cfg.cancel_fraction <= 1.0 or cfg.clients < 1:
        parser.error("--cancel-fraction must be in [0, 1] and --clients >= 1")
    summary = asyncio.run(run_load(cfg))
    print(format_summary(summary))
    if args.json:
        write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
