"""The fleet bench's world: a local control plane, kwok nodes on loopback pod CIDRs, the pod
metrics simulator, the operator as the chart runs it, and LeaderWorkerSet's controller.

Why a module of its own: `bench.fleet` says what is measured; this one owns every process it
starts (and stops them all, whatever happened), and reads what the processes cost: CPU seconds
and RSS from /proc, the operator's own /metrics, and the API server's per-identity request
counts (`e2e.apicount`). The fleet test (e2e/tests/test_fleet_kwok.py) uses the same pieces on
the session's cluster.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from e2e.cluster.controlplane import REPO_ROOT
from e2e.cluster.processes import free_port

T = TypeVar("T")
TICK = os.sysconf("SC_CLK_TCK")
CRDS = REPO_ROOT / "crds"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS), or the most it ever was (VmHWM: the peak a memory limit
    must hold), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_until(what: str, check: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s (last: {str(last)[:300]})")


@dataclass
class Proc:
    """A process this bench started, in its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mb(self.pid)

    def peak_rss(self) -> float:
        return rss_mb(self.pid, "VmHWM")

    def stop(self, grace: float = 15) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()


def spawn(name: str, argv: list[str], log: Path, *, env: dict[str, str] | None = None,
          stdin: int | None = None, stdout: int | None = None) -> Proc:  # fmt: skip
    out = log.open("ab")
    popen = subprocess.Popen(
        argv, stdout=stdout if stdout is not None else out, stderr=out, stdin=stdin,
        start_new_session=True, cwd=REPO_ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    out.close()
    return Proc(name, popen, log)


@dataclass
class MetricsSim:
    """`bench._fleet_sim`: every pod's /metrics on its pod IP, and its control API."""

    proc: Proc
    port: int

    @classmethod
    def start(cls, kubeconfig: str, namespaces: list[str], log: Path) -> MetricsSim:
        argv = [sys.executable, "-m", "bench._fleet_sim", f"--kubeconfig={kubeconfig}"]
        argv += [f"--namespace={ns}" for ns in namespaces]
        proc = spawn("metrics-sim", argv, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.popen.stdout is not None
        line = proc.popen.stdout.readline().decode().split()
        if line[:1] != ["ready"]:
            proc.stop()
            raise RuntimeError(f"the metrics simulator did not start; log {log}")
        return cls(proc, int(line[1]))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method)  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.popen.stdin.close()
        self.proc.stop()


@dataclass
class Operator:
    """`pdwarden run` with the chart's flags (deployment.yaml), under the chart's identity."""

    kubeconfig: str
    directory: Path
    extra: list[str] = field(default_factory=list)
    proc: Proc | None = None
    metrics_port: int = 0

    def start(self, name: str = "operator") -> Operator:
        key = self.directory / "token-key"
        if not key.exists():
            key.write_text(secrets.token_urlsafe(36))
            key.chmod(0o600)
        self.metrics_port = free_port()
        argv = [
            str(Path(sys.executable).parent / "pdwarden"), "run", "--standalone",
            f"--liveness-port={free_port()}", f"--metrics-port={self.metrics_port}",
            "--resync-seconds=5", f"--token-key-file={key}", "--host=127.0.0.1", *self.extra,
        ]  # fmt: skip
        env = {"KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
        self.proc = spawn(name, argv, self.directory / f"{name}.log", env=env)
        wait_until("the operator's /metrics", self._up, 60, 0.5)
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            raise RuntimeError(f"the operator exited; log {self.proc.log}")
        try:
            self.metrics()
        except OSError:
            return False
        return True

    def metrics(self) -> dict[str, float]:
        """Every sample of the operator's /metrics, by its line's name and labels."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def histogram(samples: dict[str, float], name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram's buckets, summed over label sets."""
    buckets: dict[float, float] = {}
    for key, value in samples.items():
        if key.startswith(name + "_bucket{"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0) + value
    return sorted(buckets.items())


def quantile(before: list[tuple[float, float]], after: list[tuple[float, float]],
             q: float) -> float | None:  # fmt: skip
    """The q-quantile of what a histogram observed between two reads: the upper bound of the
    bucket it falls in; None if nothing was observed or if it lies above the largest finite
    bucket (JSON has no infinity)."""
    old = dict(before)
    counts = [(b, c - old.get(b, 0)) for b, c in after]
    n = counts[-1][1] if counts else 0
    if n <= 0:
        return None
    bound = next(b for b, c in counts if c >= q * n)
    return bound if math.isfinite(bound) else None


@contextlib.contextmanager
def stopping(*items: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for item in reversed(items):
            with contextlib.suppress(Exception):
                item.stop()
