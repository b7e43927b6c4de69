"""The `pdworker` command line: prefill, decode, router and load generator."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pdworker import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdworker",
        description="Reference prefill/decode KV-transfer worker (torch + NIXL).",
    )
    parser.add_argument("--version", action="version", version=f"pdworker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in (
        ("prefill", "run a prefill worker"),
        ("decode", "run a decode worker"),
        ("router", "run the request router"),
        ("load", "run the load generator"),
    ):
        sub.add_parser(name, help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Unknown options are named before a missing command is, so typos get a useful message.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("a COMMAND is required; see --help")
    print(f"pdworker: '{args.command}' is not built yet (the worker issue).", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
