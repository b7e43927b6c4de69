"""Real pdworker processes on 127.0.0.1, for the benchmarks and for the worker tests alike.

Why one module: the benchmarks (`bench/*.py`) and the worker tests (`tests/worker`, through the
`pd` fixture) start the same prefill, decode, router and `pdworker load` processes; two copies
of this code had drifted (one lacked the bootstrap key, one could not restart a worker). Tests
import it as `bench.harness`, the way `tests/bench` already imports `bench`.

Every process gets free ports on loopback, the admin and bootstrap key files the worker requires,
a log file in the harness's folder, and its own process group, which `close()` kills, so nothing
outlives a test or a benchmark. Every wait polls an observable condition (an endpoint, a metric)
against a deadline; nothing here sleeps to let time pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.httpjson import http

from pdworker import contract as c

LOOPBACK = "127.0.0.1"
TOKEN = "pd-harness-admin-token"
BOOTSTRAP_TOKEN = "pd-harness-bootstrap-token"
ALLOW_LOOPBACK = "127.0.0.0/8"  # the bootstrap endpoints a decode here may dial (--prefill-allow)
VOCAB = "1024"  # every flag set here uses this vocabulary; `load` sends token ids below it
# Small KV and short deadlines, so a whole test suite fits on two busy cores. Deadlines are short
# where a test is about a deadline (it sets its own) and otherwise long enough that a starved CI
# box does not hit them. The worker tests start every process with these (see the `pd` fixture).
SMALL = [
    "--layers", "2", "--heads", "2", "--head-dim", "16", "--page-size", "4",
    "--vocab", VOCAB, "--kv-pages", "1024", "--chunk-pages", "2", "--transfer-threads", "2",
    "--heartbeat-interval", "0.5", "--heartbeat-failures", "3", "--peer-timeout", "3",
    "--bootstrap-timeout", "20", "--waiting-timeout", "20", "--inflight-timeout", "20",
    "--transfer-timeout", "3", "--abort-ack-timeout", "3",
]  # fmt: skip
# The gauges that are 0 on an idle worker (queues and running requests).
QUEUES = (
    c.PREFILL_BOOTSTRAP_QUEUE,
    c.PREFILL_INFLIGHT_QUEUE,
    c.DECODE_PREALLOC_QUEUE,
    c.DECODE_TRANSFER_QUEUE,
    c.DECODE_RUNNING,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class WaitTimeout(AssertionError, TimeoutError):
    """A condition did not hold in time: a failed assertion in a test, a TimeoutError in a bench."""


class ProcessFailed(AssertionError, RuntimeError):
    """A worker exited while awaited, or `pdworker load` failed (the output's tail is said)."""


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = LOOPBACK) -> int:
    """A port free now that a worker will bind a moment later.

    Taken below the kernel's ephemeral range: outgoing connections (HTTP clients, UCX) take
    their source ports from that range, so a port picked there by binding port 0 can be taken
    by someone else's connection before the worker binds it (seen as EADDRINUSE in full runs).
    Never the same port twice in one process.
    """
    low, high = 20000, _ephemeral_low() - 1
    rng = random.Random()
    for _ in range(500 if high > low else 0):
        port = rng.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # no room below the ephemeral range: let the kernel choose
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `cond` until it returns something true (returned); raise WaitTimeout at the deadline.

    Connection errors and unparsable answers count as "not yet" (a process still starting).
    """
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
    raise WaitTimeout(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def scrape(url: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def queues_idle(url: str) -> bool:
    s = scrape(url)
    return all(metric(s, q) == 0 for q in QUEUES)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    port: int
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    bootstrap_port: int | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None


class Workers:
    """pdworker processes on 127.0.0.1 for one test or benchmark; `close()` kills them all.

    `flags` go first on every worker's command line (a test suite's SMALL model); `wait` makes
    `worker()` and `router()` return only once the process answers /readyz (tests), otherwise the
    caller starts several and waits for them together (benchmarks). Without `tmp` the logs and
    key files go to a temporary folder removed by `close()`.
    """

    def __init__(
        self, tmp: Path | None = None, *, flags: Sequence[str] = (), wait: bool = False
    ) -> None:
        self._tmp = None if tmp else tempfile.TemporaryDirectory(prefix="pdharness-")
        self.tmp = tmp or Path(self._tmp.name)  # type: ignore[union-attr]
        self.flags = list(flags)
        self.wait = wait
        self.procs: list[Proc] = []
        self.token_file = self.tmp / "admin-token"
        self.token_file.write_text(TOKEN + "\n")
        self.bootstrap_token_file = self.tmp / "bootstrap-token"
        self.bootstrap_token_file.write_text(BOOTSTRAP_TOKEN + "\n")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def spawn(
        self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None
    ) -> Proc:
        """`python -m pdworker.cli ARGV` in its own process group, logging to <tmp>/<name>-N.log.

        The environment is this one's without what would change a worker behind the caller's
        back (fault switches, key files, POD_IP); `env` adds to it.
        """
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        full_env = {**os.environ, "PDWORKER_FAULTS": "", "PDWORKER_ADMIN_TOKEN_FILE": "",
                    "PDWORKER_BOOTSTRAP_TOKEN_FILE": ""}  # fmt: skip
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
        self, role: str, *extra: str, port: int | None = None, name: str | None = None,
        bootstrap_port: int | None = None, env: dict[str, str] | None = None,
        token: bool = True, bootstrap_token: bool = True, wait: bool | None = None,
    ) -> Proc:  # fmt: skip
        """A prefill or decode worker: `flags`, then `extra`; the key files unless told not to."""
        port = port or free_port()
        pod = name or f"{role}-{port}"
        argv = [role, "--host", LOOPBACK, "--port", str(port), "--pod-name", pod, *self.flags]
        bootstrap = None
        if role == "prefill":
            bootstrap = bootstrap_port or free_port()
            argv += ["--bootstrap-port", str(bootstrap)]
        else:  # every prefill here is on loopback; `extra` may narrow it (the last one counts)
            argv += ["--prefill-allow", ALLOW_LOOPBACK]
        if token:
            argv += ["--admin-token-file", str(self.token_file)]
        if bootstrap_token:
            argv += ["--bootstrap-token-file", str(self.bootstrap_token_file)]
        proc = self.spawn(pod, [*argv, *extra], port, env)
        proc.bootstrap_port = bootstrap
        if wait or (wait is None and self.wait):
            self.wait_ready(proc)
        return proc

    def router(self, prefills: Sequence[Proc], decodes: Sequence[Proc]) -> Proc:
        port = free_port()
        argv = ["router", "--host", LOOPBACK, "--port", str(port),
                "--prefill", ",".join(p.url for p in prefills),
                "--decode", ",".join(d.url for d in decodes)]  # fmt: skip
        proc = self.spawn(f"router-{port}", argv, port)
        if self.wait:
            self.wait_ready(proc)
        return proc

    def trio(
        self, *prefill_extra: str, decode_extra: tuple[str, ...] = ()
    ) -> tuple[Proc, Proc, Proc]:
        """One prefill, one decode and a router over them, all ready."""
        prefill = self.worker("prefill", *prefill_extra, wait=False)
        decode = self.worker("decode", *decode_extra, wait=False)
        self.wait_ready(prefill, decode)
        router = self.router([prefill], [decode])
        self.wait_ready(router)
        return prefill, decode, router

    def restart(self, proc: Proc) -> Proc:
        """Kill a worker and start it again with the same name, ports and flags."""
        self.kill(proc)
        again = self.spawn(proc.name, proc.argv, proc.port, proc.env)
        again.bootstrap_port = proc.bootstrap_port
        return again

    def wait_ready(self, *procs: Proc, timeout: float = 120) -> None:
        """Until each answers 200 on /readyz; ProcessFailed (with its log) if one exits first."""
        for proc in procs:

            def ready(proc: Proc = proc) -> bool:
                if not proc.alive():
                    raise ProcessFailed(f"{proc.name} exited:\n{proc.log.read_text()[-3000:]}")
                return http("GET", f"{proc.url}{c.READYZ_PATH}", timeout=2)[0] == 200

            wait_for(ready, timeout, f"{proc.name} ready")

    def admin(self, proc: Proc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, f"{proc.url}{path}", body, token=TOKEN, timeout=60)

    def load(self, target: Proc | str, *args: str, timeout: float = 600) -> dict[str, Any]:
        """Run `pdworker load` against a router (its own process, as a user would) -> summary.

        `--vocab` is the harness's unless `args` say otherwise (the last one counts).
        """
        url = target if isinstance(target, str) else target.url
        out = self.tmp / f"load-{time.monotonic_ns()}.json"
        argv = [sys.executable, "-m", "pdworker.cli", "load", "--url", url, "--vocab", VOCAB,
                "--json", str(out), *args]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise ProcessFailed(f"pdworker load failed: {done.stderr[-2000:]}")
        summary: dict[str, Any] = json.loads(out.read_text())
        return summary

    def load_background(self, target: Proc, *args: str) -> subprocess.Popen[bytes]:
        """`pdworker load` left running (output discarded); `close()` ends it with the rest."""
        argv = [sys.executable, "-m", "pdworker.cli", "load", "--url", target.url,
                "--vocab", VOCAB, *args]  # fmt: skip
        popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)  # fmt: skip
        self.procs.append(Proc("load", popen, target.url, self.tmp / "load.log", 0))
        return popen

    def clean(self, proc: Proc) -> bool:
        """Queues 0, no rooms in any phase, every KV page free, all at once."""
        s = scrape(proc.url)
        status, rooms = self.admin(proc, "GET", c.ADMIN_ROOMS_PATH)
        pages = metric(s, c.KV_PAGES_FREE) == metric(s, c.KV_PAGES_TOTAL)
        return all(metric(s, q) == 0 for q in QUEUES) and status == 200 and rooms == [] and pages

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)
        _reap(proc, 15)

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs:
            _reap(proc, 10)
        if self._tmp is not None:
            self._tmp.cleanup()


def _reap(proc: Proc, grace: float) -> None:
    """Wait for a signalled process; SIGKILL its group if it outstays `grace` seconds."""
    try:
        proc.popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)


def wait_clean(w: Workers, proc: Proc, timeout: float = 15) -> None:
    """Until `proc` is clean (queues at 0, no rooms, every KV page free)."""
    wait_for(lambda: w.clean(proc), timeout, f"{proc.name} clean (queues 0, no rooms, pages free)")
