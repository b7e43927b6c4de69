"""Metrics simulator: realistic pdworker /metrics (and prefill /admin/rooms) on many 127.x IPs.

Why: the operator scrapes pods by pod IP; to measure it at 2000 pods without 2000 workers, one
aiohttp process serves each fake pod's body on its own loopback address (127.20.x.y, one port),
the way a pod answers on its pod IP. Bodies are rendered once per pod by pdworker's own
`WorkerMetrics`, so names, types and labels are exactly what the operator parses in production.
Loopback only: every address bound is in 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pods", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    asyncio.run(serve(args.pods, args.port))


if __name__ == "__main__":
    main()
