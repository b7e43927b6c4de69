"""Real-process harness for pdworker tests: prefill, decode, router and load on 127.0.0.1.

(A uniquely named module rather than conftest.py, so imports never collide with tests/conftest.py.)

Every process gets free ports, logs to the test's tmp dir, and is killed in teardown (the whole
process group, so nothing outlives a test). Waits poll a condition with a deadline; no test relies
on a bare sleep.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.httpjson import http
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "test-admin-token"
BOOTSTRAP_TOKEN = "test-bootstrap-token"
# Small KV so the suite fits on two busy cores. Deadlines are short where a test is about a
# deadline (it sets its own) and otherwise long enough that a starved CI box does not hit them.
SMALL = [
    "--layers", "2", "--heads", "2", "--head-dim", "16", "--page-size", "4",
    "--vocab", "1024", "--kv-pages", "1024", "--chunk-pages", "2", "--transfer-threads", "2",
    "--heartbeat-interval", "0.5", "--heartbeat-failures", "3", "--peer-timeout", "3",
    "--bootstrap-timeout", "20", "--waiting-timeout", "20", "--inflight-timeout", "20",
    "--transfer-timeout", "3", "--abort-ack-timeout", "3",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    port: int
    bootstrap_port: int | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None


class PD:
    """Starts and tracks pdworker processes for one test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.token_file = tmp / "admin-token"
        self.token_file.write_text(TOKEN + "\n")
        self.bootstrap_token_file = tmp / "bootstrap-token"
        self.bootstrap_token_file.write_text(BOOTSTRAP_TOKEN + "\n")

    def _spawn(self, name: str, argv: list[str], url: str, port: int, env: dict[str, str]) -> Proc:
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        full_env = {**os.environ, "PDWORKER_FAULTS": "", **env}
        full_env.pop("POD_IP", None)
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "pdworker.cli", *argv],
                stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, popen, url, log, port)
        self.procs.append(proc)
        return proc

    def worker(
        self, role: str, *extra: str, port: int | None = None, token: bool = True,
        env: dict[str, str] | None = None, wait: bool = True, bootstrap_token: bool = True,
    ) -> Proc:  # fmt: skip
        port = port or free_port()
        argv = [role, "--host", "127.0.0.1", "--port", str(port), "--pod-name", f"{role}-{port}"]
        argv += SMALL
        bootstrap = None
        if role == "prefill":
            bootstrap = free_port()
            argv += ["--bootstrap-port", str(bootstrap)]
        if token:
            argv += ["--admin-token-file", str(self.token_file)]
        if bootstrap_token:
            argv += ["--bootstrap-token-file", str(self.bootstrap_token_file)]
        env = dict(env or {})
        env.setdefault("PDWORKER_ADMIN_TOKEN_FILE", "")
        env.setdefault("PDWORKER_BOOTSTRAP_TOKEN_FILE", "")
        proc = self._spawn(role, [*argv, *extra], f"http://127.0.0.1:{port}", port, env)
        proc.bootstrap_port = bootstrap
        if wait:
            self.wait_ready(proc)
        return proc

    def router(self, prefills: list[Proc], decodes: list[Proc]) -> Proc:
        port = free_port()
        argv = ["router", "--host", "127.0.0.1", "--port", str(port),
                "--prefill", ",".join(p.url for p in prefills),
                "--decode", ",".join(d.url for d in decodes)]  # fmt: skip
        proc = self._spawn("router", argv, f"http://127.0.0.1:{port}", port, {})
        self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 60) -> None:
        def ready() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.log.read_text()[-3000:]}")
            return http("GET", f"{proc.url}/readyz", timeout=2)[0] == 200

        wait_for(ready, timeout, f"{proc.name} ready")

    def trio(
        self, *prefill_extra: str, decode_extra: tuple[str, ...] = ()
    ) -> tuple[Proc, Proc, Proc]:
        prefill = self.worker("prefill", *prefill_extra, wait=False)
        decode = self.worker("decode", *decode_extra, wait=False)
        self.wait_ready(prefill)
        self.wait_ready(decode)
        return prefill, decode, self.router([prefill], [decode])

    def load(self, router: Proc, *args: str, timeout: float = 300) -> dict[str, Any]:
        out = self.tmp / f"load-{time.monotonic_ns()}.json"
        argv = [sys.executable, "-m", "pdworker.cli", "load", "--url", router.url,
                "--vocab", "1024", "--json", str(out), *args]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(out.read_text())

    def load_background(self, router: Proc, *args: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "pdworker.cli", "load", "--url", router.url,
                "--vocab", "1024", *args]  # fmt: skip
        popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)  # fmt: skip
        self.procs.append(Proc("load", popen, router.url, self.tmp / "load.log", 0))
        return popen

    def admin(self, proc: Proc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, f"{proc.url}{path}", body, token=TOKEN)

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


def queues_idle(url: str) -> bool:
    s = scrape(url)
    names = [
        "pdworker_prefill_bootstrap_queue_reqs", "pdworker_prefill_inflight_queue_reqs",
        "pdworker_decode_prealloc_queue_reqs", "pdworker_decode_transfer_queue_reqs",
        "pdworker_decode_running_reqs",
    ]  # fmt: skip
    return all(metric(s, n) == 0 for n in names)


def wait_clean(pd: PD, proc: Proc, timeout: float = 15) -> None:
    """Queues at 0, no rooms (any phase) and every KV page free, all at once."""

    def clean() -> bool:
        s = scrape(proc.url)
        status, rooms = pd.admin(proc, "GET", "/admin/rooms")
        pages_free = metric(s, "pdworker_kv_pages_free") == metric(s, "pdworker_kv_pages_total")
        return queues_idle(proc.url) and status == 200 and rooms == [] and pages_free

    wait_for(clean, timeout, f"{proc.name} clean (queues 0, no rooms, pages free)")
