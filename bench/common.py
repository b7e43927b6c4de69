"""What every benchmark shares: arguments, statistics, result files, the README table, the tail.

Why one module: each benchmark must take the same arguments and write its JSON, its PNG and its
README row the same way, so the scripts themselves only say what they measure. The pdworker
processes they measure come from `bench.harness`, which the worker tests share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
TABLE_START = "<!-- results-table:start -->"
TABLE_END = "<!-- results-table:end -->"
TABLE_HEADER = "| benchmark | mode | date | machine | key figures |\n|---|---|---|---|---|"


def parse_args(
    description: str, argv: Sequence[str] | None = None, *, device: bool = False,
    short: bool = False,
) -> argparse.Namespace:  # fmt: skip
    """--quick, --out, --readme; with `device` --device, with `short` --short."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds (used by tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    p.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="README whose results table gets this row (default: bench/README.md when --out "
        "is bench/results, none otherwise)",
    )
    if device:
        p.add_argument("--device", default="cpu", help="cpu, or cuda[:N] for the GPU benchmark")
    if short:
        p.add_argument("--short", action="store_true", help="CPU: 1-64 MiB, 7 reps, default UCX")
    args = p.parse_args(argv)
    if args.readme is None and args.out.resolve() == DEFAULT_OUT.resolve():
        args.readme = README
    return args


def main(
    description: str, run: Callable[..., dict[str, Any]], argv: Sequence[str] | None, *,
    show: Callable[[dict[str, Any]], Any] = lambda data: data, limit: int | None = None,
    device: bool = False, short: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Every benchmark's `main`: its arguments, `run(quick, out, readme[, device][, short])`, and
    `show(data)` printed as JSON (cut at `limit` characters)."""
    args = parse_args(description, argv, device=device, short=short)
    extra: dict[str, Any] = {}
    if device:
        extra["device"] = args.device
        if args.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: no CUDA device here (torch.cuda.is_available())")
    if short:
        extra["short"] = args.short
    data = run(args.quick, args.out, args.readme, **extra)
    print(json.dumps(show(data), indent=1, default=str)[:limit])
    return data


def machine_note() -> str:
    gpu = "GPU" if Path("/dev/nvidia0").exists() else "no GPU"
    return f"{os.cpu_count()} cores, {gpu}"


def stats(values: Iterable[float]) -> dict[str, float]:
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"min": 0.0, "median": 0.0, "max": 0.0, "n": 0}
    return {"min": vals[0], "median": statistics.median(vals), "max": vals[-1], "n": len(vals)}


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


def finish(  # noqa: PLR0917
    out: Path, name: str, quick: bool, readme: Path | None, data: dict[str, Any], figures: str,
    plot: Callable[[Path], None], readme_mode: str | None = None,
) -> Path:  # fmt: skip
    """Every run's tail: `plot(png_path)`, then the JSON and the README row (`write_result`).

    A machine without matplotlib (a bare GPU lease) still gets its numbers; the JSON says why
    there is no picture under `no_plot`.
    """
    try:
        plot(plot_path(out, name, quick))
    except ImportError as exc:
        data["no_plot"] = str(exc)
    return write_result(out, name, data, quick, readme, figures, readme_mode)


def write_result(  # noqa: PLR0917
    out: Path, name: str, data: dict[str, Any], quick: bool, readme: Path | None, figures: str,
    readme_mode: str | None = None,
) -> Path:  # fmt: skip
    """Write <out>/<name>[-quick].json with a common header and update the README row.

    `readme_mode` names the row's mode where it differs from the JSON's (kv_transfer --short).
    """
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).replace(microsecond=0)
    doc = {
        "benchmark": name,
        "mode": "quick" if quick else "full",
        "date": stamp.isoformat().replace("+00:00", "Z"),
        "machine": machine_note(),
        "python": platform.python_version(),
        "summary": figures,
        **data,
    }
    suffix = "-quick" if quick else ""
    path = out / f"{name}{suffix}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    if readme is not None:
        mode = readme_mode or doc["mode"]
        update_readme(readme, name, mode, stamp.date().isoformat(), figures)
    return path


def update_readme(readme: Path, name: str, mode: str, date: str, figures: str) -> None:
    """Replace (or add) the row for (benchmark, mode) in the README's results table."""
    text = readme.read_text() if readme.exists() else f"{TABLE_START}\n{TABLE_END}\n"
    if TABLE_START not in text:
        text += f"\n{TABLE_START}\n{TABLE_END}\n"
    head, rest = text.split(TABLE_START, 1)
    body, tail = rest.split(TABLE_END, 1)
    rows = [ln for ln in body.strip().splitlines() if ln.startswith("| ") and "---" not in ln]
    rows = [r for r in rows if not r.startswith("| benchmark |")]
    cell = figures.replace("|", "/").replace("\n", " ")
    new = f"| {name} | {mode} | {date} | {machine_note()} | {cell} |"
    rows = [r for r in rows if not re.match(rf"\| {re.escape(name)} \| {mode} \|", r)]
    rows.append(new)
    rows.sort()
    table = "\n".join([TABLE_HEADER, *rows])
    readme.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")


def plot_path(out: Path, name: str, quick: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}{'-quick' if quick else ''}.png"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def figure(path: Path, *grid: int, title: str | None = None, **kw: Any) -> Iterator[Any]:
    """The axes of `plt.subplots(*grid, **kw)`; the figure is laid out (with `title` over all),
    saved to `path` and closed when the block ends."""
    plt = pyplot()
    fig, axes = plt.subplots(*grid, **kw)
    try:
        yield axes
        if title is not None:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def label(
    ax: Any, xlabel: str, ylabel: str, title: str | None = None, *, legend: bool = True
) -> None:
    """The benchmarks' axes: labels, an optional title, a small legend, a light grid."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    if legend:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
