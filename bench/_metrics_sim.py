"""Metrics simulator: realistic pdworker and SGLang /metrics on loopback addresses.

Why: the operator scrapes pods by pod IP; to measure it at 2000 pods without 2000 workers, one
aiohttp process serves each fake pod's body on its own loopback address (127.20.x.y, one port),
the way a pod answers on its pod IP. pdworker bodies are rendered once per pod by pdworker's own
`WorkerMetrics`, so names, types and labels are exactly what the operator parses in production.

SGLang cannot run here (no GPU), so `SglangPlayer` plays SGLang's series instead: each body
starts from a fixture that tests/remediation/data/make_sglang_fixtures.py wrote with
prometheus-client in multiprocess mode and sglang 0.5.23's names, HELP text and labels (two DP
ranks, priority scheduling), and only the numbers change over time, following what the source
says moves when (see `pdwarden.engines`). The engine is simulated; the
format is not.
Loopback only: every address bound is in 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web

from pdworker.metrics import WorkerMetrics


def pod_ip(i: int) -> str:
    return f"127.20.{i // 250}.{i % 250 + 1}"


def role_of(i: int) -> str:
    return "prefill" if i % 3 == 0 else "decode"


def body(i: int) -> bytes:
    role = role_of(i)
    m = WorkerMetrics(role, f"{role}-sim-{i}-0123456789ab")
    m.generated_tokens.inc(1000 + i)
    m.completed.labels(role=role).inc(500 + i)
    m.failed.labels(reason="aborted").inc(i % 7)
    m.kv_bytes.inc(123456789)
    for v in (0.002, 0.01, 0.05):
        m.kv_seconds.observe(v)
    return m.render()


async def serve(n: int, port: int) -> None:
    bodies = {pod_ip(i): body(i) for i in range(n)}
    rooms = json.dumps([]).encode()

    async def metrics(request: web.Request) -> web.Response:
        host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        return web.Response(body=bodies.get(host, b""), content_type="text/plain")

    async def admin_rooms(_: web.Request) -> web.Response:
        return web.Response(body=rooms, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/rooms", admin_rooms)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for ip in bodies:
        assert ipaddress.ip_address(ip).is_loopback
        await web.TCPSite(runner, ip, port).start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    await runner.cleanup()


SGLANG_DATA = Path(__file__).resolve().parents[1] / "tests" / "remediation" / "data"
SGLANG_BASE = {
    "prefill": "sglang_prefill_dp2_priority.prom",
    "decode": "sglang_decode_dp2_priority.prom",
}
_STAGES = "sglang:per_stage_req_latency_seconds"
# A knob of the simulated engine -> (series name, label selection).
SGLANG_KNOBS: dict[str, tuple[str, dict[str, str]]] = {
    "running": ("sglang:num_running_reqs", {}),
    "waiting": ("sglang:num_queue_reqs", {}),
    "inflight": ("sglang:num_prefill_inflight_queue_reqs", {}),
    "bootstrap": ("sglang:num_prefill_bootstrap_queue_reqs", {}),
    "prealloc": ("sglang:num_decode_prealloc_queue_reqs", {}),
    "transfer": ("sglang:num_decode_transfer_queue_reqs", {}),
    "throughput": ("sglang:gen_throughput", {}),
    "decode_tokens": ("sglang:realtime_tokens_total", {"mode": "decode"}),
    "prefill_tokens": ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    # Rooms whose real KV transfer succeeded (what pdwarden reads; a probe never moves it).
    "sent": ("sglang:kv_transfer_latency_ms_count", {}),
    "probe_sent": (f"{_STAGES}_count", {"stage": "prefill_transfer_kv_cache"}),
    "arrived": (f"{_STAGES}_count", {"stage": "decode_transferred"}),
    "transfer_failed": ("sglang:num_transfer_failed_reqs_total", {}),
    "bootstrap_failed": ("sglang:num_bootstrap_failed_reqs_total", {}),
    "finished": ("sglang:num_requests_total", {}),
    "generation_tokens_total": ("sglang:generation_tokens_total", {}),
}
# Queues start empty unless a knob sets them (the fixtures hold a loaded moment).
SGLANG_EMPTY = {
    "prefill": {"inflight": 0, "bootstrap": 0, "waiting": 0, "running": 0},
    "decode": {"running": 0, "waiting": 0, "prealloc": 0, "transfer": 0},
}
_sglang_cache: dict[str, str] = {}


def _set(text: str, name: str, value: float, select: Mapping[str, str]) -> str:
    """Every copy of the series on DP rank 0 (each TP copy, the priority="" total and
    priority "0") gets `value`; DP rank 1 and priority "1" get 0. Tokenizer series (no
    dp_rank) carry the value on their first line only."""
    lines = text.split("\n")
    first_plain = True
    for i, line in enumerate(lines):
        if not line.startswith(name + "{") or any(
            f'{k}="{v}"' not in line for k, v in select.items()
        ):
            continue
        if 'dp_rank="' in line:
            primary = 'dp_rank="0"' in line and 'priority="1"' not in line
        else:
            primary, first_plain = first_plain, False
        lines[i] = f"{line.rsplit(' ', 1)[0]} {float(value if primary else 0)!r}"
    return "\n".join(lines)


def sglang_body(role: str, **values: float) -> str:
    """A /metrics body in SGLang 0.5.23's exposition format with the given knob values."""
    if role not in _sglang_cache:
        _sglang_cache[role] = (SGLANG_DATA / SGLANG_BASE[role]).read_text()
    text = _sglang_cache[role]
    for knob, value in {**SGLANG_EMPTY[role], **values}.items():
        name, select = SGLANG_KNOBS[knob]
        text = _set(text, name, value, select)
        if name.endswith("_count"):  # keep the histogram consistent: +Inf bucket == count
            text = _set(text, name[: -len("_count")] + "_bucket", value, {**select, "le": "+Inf"})
    return text


class SglangPlayer:
    """Serves simulated SGLang pods on 127.0.0.1, one port each, from a timeline.

    `timeline(pod, seconds_since_start)` returns the knob values of that pod now; every scrape
    renders a fresh body. Runs its own event loop in a thread; `ports` maps pod -> port.
    """

    def __init__(
        self, roles: Mapping[str, str], timeline: Callable[[str, float], Mapping[str, float]]
    ) -> None:
        self.roles = dict(roles)
        self.timeline = timeline
        self.ports: dict[str, int] = {}
        self.t0 = time.monotonic()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> SglangPlayer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("SGLang metrics player did not start")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        runners = []
        for pod, role in self.roles.items():

            async def metrics(_: web.Request, pod: str = pod, role: str = role) -> web.Response:
                values = self.timeline(pod, time.monotonic() - self.t0)
                return web.Response(text=sglang_body(role, **values), content_type="text/plain")

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.ports[pod] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            runners.append(runner)
        self._ready.set()
        await self._stop.wait()
        for runner in runners:
            await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pods", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    asyncio.run(serve(args.pods, args.port))


if __name__ == "__main__":
    main()
