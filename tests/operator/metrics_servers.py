"""Loopback /metrics servers in a process of their own, like pods on other machines.

Why a separate process: a test that measures the operator's event loop must not also pay for
serving the bodies it scrapes. `serve_in_process(kind, n)` starts n servers that answer with one
of the bodies below and yields their ports.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

DATA = Path(__file__).parents[1] / "remediation" / "data"
MIB = 1024 * 1024


def padded_body(size: int) -> bytes:
    """A real SGLang decode body grown to `size` bytes with series nobody reads (histogram
    buckets, as SGLang's own exposition is mostly), and one series we do read at the very end,
    so a body cut anywhere loses it."""
    head = (DATA / "sglang_decode_dp2_priority.prom").read_text()
    tail = (
        'sglang:num_decode_transfer_queue_reqs{dp_rank="3",engine_type="decode",'
        'model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="3"} 7.0\n'
    )
    filler = 'sglang:inter_token_latency_seconds_bucket{le="0.002",model_name="m"} 1.0\n'
    n = (size - len(head) - len(tail) - 2) // len(filler)
    body = head + filler * n
    body += "#" * (size - len(body) - len(tail) - 1) + "\n" + tail
    assert len(body) == size
    return body.encode()


def hostile_body(size: int = MIB) -> bytes:
    """Just under `size`, the costliest input that is still valid for the parser: series we
    read, each with label values full of escapes (prometheus-client's parser took ~1 s per MiB
    of this)."""
    value = '\\"' * 255
    labels = ",".join(f'l{i}="{value}"' for i in range(7))
    line = f'sglang:num_running_reqs{{{labels},tp_rank="0"}} 1\n'.encode()
    return line * (size // len(line))


def benign_body() -> bytes:
    return (DATA / "sglang_decode_dp2_priority.prom").read_bytes()


BODIES = {
    "hostile": hostile_body,
    "benign-1mib": lambda: padded_body(MIB - 1000),
    "benign": benign_body,
}


def _serve(kind: str, n: int, conn: Connection) -> None:
    from aiohttp import web

    body = BODIES[kind]()

    async def main() -> None:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(n):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        conn.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        await runner.cleanup()

    asyncio.run(main())


@contextmanager
def serve_in_process(kind: str, n: int) -> Iterator[list[int]]:
    parent, child = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(kind, n, child))
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError(f"{kind} metrics servers did not start")
        yield parent.recv()
    finally:
        if proc.is_alive():
            parent.send("stop")
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
