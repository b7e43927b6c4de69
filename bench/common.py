"""What every benchmark shares: arguments, statistics, result files, the README table, processes.

Why one module: each benchmark must write its JSON, its PNG and its README row the same way, and
start real pdworker processes on loopback the same way (free ports on 127.0.0.1, logs in a temp
dir, whole process groups killed at the end), so the scripts themselves only say what they
measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e.httpjson import http

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
TOKEN = "bench-admin-token"
LOOPBACK = "127.0.0.1"
TABLE_START = "<!-- results-table:start -->"
TABLE_END = "<!-- results-table:end -->"
TABLE_HEADER = "| benchmark | mode | date | machine | key figures |\n|---|---|---|---|---|"


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
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
    args = p.parse_args(argv)
    if args.readme is None and args.out.resolve() == DEFAULT_OUT.resolve():
        args.readme = README
    return args


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


def write_result(  # noqa: PLR0917
    out: Path, name: str, data: dict[str, Any], quick: bool, readme: Path | None, figures: str
) -> Path:
    """Write <out>/<name>[-quick].json with a common header and update the README row."""
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
        update_readme(readme, name, doc["mode"], stamp.date().isoformat(), figures)
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


# -- HTTP and metrics -----------------------------------------------------------------------


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


QUEUES = (
    "pdworker_prefill_bootstrap_queue_reqs",
    "pdworker_prefill_inflight_queue_reqs",
    "pdworker_decode_prealloc_queue_reqs",
    "pdworker_decode_transfer_queue_reqs",
    "pdworker_decode_running_reqs",
)


# -- worker processes on loopback -----------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    port: int
    argv: list[str]
    env: dict[str, str]
    bootstrap_port: int | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None


class Workers:
    """pdworker processes on 127.0.0.1 for one benchmark; `close()` kills every process group."""

    def __init__(self, tmp: Path | None = None) -> None:
        self._tmp = None if tmp else tempfile.TemporaryDirectory(prefix="pdbench-")
        self.tmp = tmp or Path(self._tmp.name)  # type: ignore[union-attr]
        self.procs: list[Proc] = []
        self.token_file = self.tmp / "admin-token"
        self.token_file.write_text(TOKEN + "\n")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def spawn(
        self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None
    ) -> Proc:
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        full_env = {**os.environ, "PDWORKER_FAULTS": "", "PDWORKER_ADMIN_TOKEN_FILE": ""}
        full_env.pop("POD_IP", None)
        full_env.update(env or {})
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "pdworker.cli", *argv],
                stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, popen, f"http://{LOOPBACK}:{port}", log, port, argv, dict(env or {}))
        self.procs.append(proc)
        return proc

    def worker(
        self, role: str, flags: Sequence[str], *, env: dict[str, str] | None = None,
        name: str | None = None, port: int | None = None, bootstrap_port: int | None = None,
    ) -> Proc:  # fmt: skip
        port = port or free_port()
        pod = name or f"{role}-{port}"
        argv = [role, "--host", LOOPBACK, "--port", str(port), "--pod-name", pod, *flags]
        argv += ["--admin-token-file", str(self.token_file)]
        argv += ["--bootstrap-token-file", str(self.token_file)]  # one local key serves both
        bootstrap = None
        if role == "prefill":
            bootstrap = bootstrap_port or free_port()
            argv += ["--bootstrap-port", str(bootstrap)]
        proc = self.spawn(pod, argv, port, env)
        proc.bootstrap_port = bootstrap
        return proc

    def router(self, prefills: Sequence[Proc], decodes: Sequence[Proc]) -> Proc:
        port = free_port()
        argv = ["router", "--host", LOOPBACK, "--port", str(port),
                "--prefill", ",".join(p.url for p in prefills),
                "--decode", ",".join(d.url for d in decodes)]  # fmt: skip
        return self.spawn(f"router-{port}", argv, port)

    def restart(self, proc: Proc) -> Proc:
        """Kill a worker and start it again with the same name, ports and flags."""
        self.kill(proc)
        again = self.spawn(proc.name, proc.argv, proc.port, proc.env)
        again.bootstrap_port = proc.bootstrap_port
        return again

    def wait_ready(self, *procs: Proc, timeout: float = 120) -> None:
        for proc in procs:

            def ready(proc: Proc = proc) -> bool:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.log.read_text()[-3000:]}")
                return http("GET", f"{proc.url}/readyz", timeout=2)[0] == 200

            wait_for(ready, timeout, f"{proc.name} ready", interval=0.1)

    def admin(self, proc: Proc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, f"{proc.url}{path}", body, token=TOKEN, timeout=60)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)
        try:
            proc.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                try:
                    os.killpg(proc.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()

    def clean(self, proc: Proc) -> bool:
        """Queues 0, no rooms in any phase, every KV page free."""
        s = scrape(proc.url)
        status, rooms = self.admin(proc, "GET", "/admin/rooms")
        pages = metric(s, "pdworker_kv_pages_free") == metric(s, "pdworker_kv_pages_total")
        return all(metric(s, q) == 0 for q in QUEUES) and status == 200 and rooms == [] and pages


def load(url: str, tmp: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run `pdworker load` against a router (its own process, as a user would) -> summary."""
    out = tmp / f"load-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "pdworker.cli", "load", "--url", url, "--json", str(out), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pdworker load failed: {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0
