"""Process wiring for `pdworker prefill|decode|router`: build the parts, serve, stop on SIGTERM.

Kept apart from cli.py so the argument parser stays declarative and this wiring can be read in
one place: model and pool first, the NIXL agent (named per incarnation) registered once on the
pool, then the role, then the HTTP servers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from typing import Any

from aiohttp import web

from pdworker import contract as c
from pdworker.config import WorkerConfig
from pdworker.discovery import Discovery
from pdworker.server import serve_until_stopped, worker_app

log = logging.getLogger(__name__)


async def run_worker(cfg: WorkerConfig, nixl_backend: str = "UCX") -> None:
    from pdworker.decode import DecodeWorker
    from pdworker.model import KVPool, TinyModel, pick_device
    from pdworker.prefill import PrefillWorker
    from pdworker.transfer import NixlTransport

    if "UCX_NET_DEVICES" not in os.environ and _is_loopback(cfg.host):
        # UCX otherwise also listens on every other interface; a loopback pod stays on loopback.
        os.environ["UCX_NET_DEVICES"] = "lo"
    device = pick_device(cfg.device)
    model = TinyModel(cfg.model, device)
    pool = KVPool(cfg.model, cfg.kv_pages, device)
    transport = NixlTransport(
        cfg.incarnation, pool.tensor, pool.page_descs(), pool.mem_type, backend=nixl_backend
    )
    log.info(
        "%s %s on %s: %d pages of %d bytes (%s, %s), %d pages per WRITE, kv-verify %s, faults %s",
        cfg.role,
        cfg.incarnation,
        device,
        cfg.kv_pages,
        cfg.model.page_bytes,
        pool.mem_type,
        transport.nixl_module,
        cfg.pages_per_chunk,
        cfg.kv_verify,
        cfg.faults.names() or "none",
    )
    worker: Any
    extra_admin = {}
    if cfg.role == "prefill":
        worker = PrefillWorker(cfg, model, pool, transport)
    else:
        worker = DecodeWorker(cfg, model, pool, transport)
        extra_admin[c.ADMIN_DECODE_STALL_PATH] = worker.handle_stall
    await worker.start()
    app = worker_app(
        render_metrics=worker.metrics.render,
        ready=worker.ready,
        admin=worker,
        token=cfg.admin_token,
        extra_admin=extra_admin,
    )
    app.router.add_post("/generate", worker.handle_generate)

    async def info(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "role": cfg.role,
                "incarnation": cfg.incarnation,
                "pod": cfg.pod,
                "bootstrap_port": cfg.bootstrap_port if cfg.role == "prefill" else None,
                "faults": cfg.faults.names(),
                "layout": cfg.model.layout(),
            }
        )

    app.router.add_get("/info", info)
    sites = [(app, cfg.host, cfg.port)]
    if cfg.role == "prefill":
        from pdworker.bootstrap import BootstrapServer

        sites.append(
            (BootstrapServer(worker, cfg.bootstrap_token).app(), cfg.host, cfg.bootstrap_port)
        )
    closed = worker.metrics.connections_closed
    await serve_until_stopped(
        sites,
        asyncio.Event(),
        on_stop=worker.stop,
        refused=lambda reason: closed.labels(reason=reason).inc(),
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def run_router(
    discovery: Discovery,
    host: str,
    port: int,
    incarnation: str,
    request_limit_s: float,
    *,
    engine: str = "pdworker",
) -> None:
    from pdworker.router import Router
    from pdworker.vllm_router import VllmRouter

    kind = VllmRouter if engine == "vllm" else Router
    router = kind(discovery, incarnation, request_timeout=request_limit_s)
    await router.start()
    closed = router.metrics.connections_closed
    await serve_until_stopped(
        [(router.app(), host, port)],
        asyncio.Event(),
        on_stop=router.stop,
        refused=lambda reason: closed.labels(reason=reason).inc(),
    )
