"""`python -m bench [NAME ...] [--quick] [--out DIR]`: run the benchmarks (default: all, full).

`make bench` runs this. Each benchmark writes bench/results/<name>.json and .png and updates its
row in bench/README.md; they run one after another so they do not disturb each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bench import common

NAMES = ("kv_transfer", "kv_storm", "request_path", "abort_storm", "recovery", "operator_scale")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("names", nargs="*", choices=[*NAMES, []], help=f"subset of {', '.join(NAMES)}")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds each")
    p.add_argument("--out", type=Path, default=common.DEFAULT_OUT, help="results folder")
    args = p.parse_args(argv)
    failed = []
    for name in args.names or NAMES:
        started = time.monotonic()
        print(f"== {name}", flush=True)
        extra = ["--quick"] if args.quick else []
        try:
            importlib.import_module(f"bench.{name}").main([*extra, "--out", str(args.out)])
        except Exception as exc:  # one broken benchmark must not hide the others' results
            print(f"!! {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
        print(f"== {name} took {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
