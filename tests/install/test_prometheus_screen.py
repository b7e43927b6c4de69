"""Prometheus mode's screen against a real Prometheus (the one `make prometheus-bin` builds).

Prometheus scrapes real pdworker /metrics bodies served on loopback addresses, labelled as the
chart's PodMonitor labels worker pods (namespace, pod; instance = address), and the operator's
one query (`scrape.screen.query`) reads them back: each pod must read exactly as its own
/metrics does through the text parser, a pod of another namespace under the same name must
never be read as ours, and a pod Prometheus cannot scrape must be sent to a direct read.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from e2e.cluster.controlplane import free_port
from e2e.prometheus import PrometheusServer

from pdwarden.remediation.scrape.prometheus import PrometheusConfig, PrometheusScreen
from pdwarden.remediation.scrape.samples import parse_metrics
from pdwarden.values import Target
from pdworker.metrics import WorkerMetrics

PORT = free_port()
PODS = {"127.0.0.21": "pd-prefill-0", "127.0.0.22": "pd-decode-0"}
DOWN = "127.0.0.23"  # nothing listens there


def body(role: str, n: int) -> bytes:
    m = WorkerMetrics(role, f"{role}-incarnation")
    m.completed.labels(role=role).inc(n)
    m.generated_tokens.inc(3 * n)
    m.kv_seconds.observe(0.02)
    return m.render()


BODIES = {ip: body(pod.split("-")[1], 7 + i) for i, (ip, pod) in enumerate(PODS.items())}


def job(ns: str, ip: str, pod: str) -> dict[str, object]:
    return {"targets": [f"{ip}:{PORT}"], "labels": {"namespace": ns, "pod": pod}}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """Real pdworker bodies on loopback, and a real Prometheus scraping them every second."""
    loop = asyncio.new_event_loop()

    async def metrics(request: web.Request) -> web.Response:
        ip = request.transport.get_extra_info("sockname")[0]  # type: ignore[union-attr]
        return web.Response(body=BODIES[ip], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    for ip in PODS:
        loop.run_until_complete(web.TCPSite(runner, ip, PORT).start())
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), free_port())
    targets = [job("ns", ip, pod) for ip, pod in PODS.items()]
    # Another tenant's pod under our decode's name, and one of ours Prometheus cannot scrape.
    targets += [job("other", "127.0.0.21", "pd-decode-0"), job("ns", DOWN, "pd-decode-1")]
    scrape = {"job_name": "podMonitor/pdw-system/pdw-pdwarden-workers/0", "scrape_interval": "1s",
              "scrape_timeout": "1s", "static_configs": targets}  # fmt: skip

    async def serve_while(done: asyncio.Event) -> None:
        await done.wait()

    server.start([scrape], {"groups": []})
    done = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve_while(done),))
    thread.start()
    deadline = time.monotonic() + 30
    while len(server.query('up{namespace="ns"} == 1')) < len(PODS):
        assert time.monotonic() < deadline, "Prometheus scraped no pod in 30 s"
        time.sleep(0.2)
    yield server
    server.stop()
    loop.call_soon_threadsafe(done.set)
    thread.join(timeout=10)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def targets() -> list[Target]:
    role = {"prefill": "prefill", "decode": "decode"}
    out = [Target(pod, f"uid-{pod}", role[pod.split("-")[1]], ip, PORT, engine="pdworker")
           for ip, pod in PODS.items()]  # fmt: skip
    return [*out, Target("pd-decode-1", "uid-pd-decode-1", "decode", DOWN, PORT)]


def test_each_pod_reads_from_prometheus_as_from_its_own_metrics(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    async def look() -> dict[str, object]:
        # Unscoped (a cluster-wide operator): the answer holds the other tenant's pod too.
        screen = PrometheusScreen(PrometheusConfig(prometheus.url))
        try:
            view = await screen.look("ns", targets(), max_age=10.0)
        finally:
            await screen.close()
        assert view.error == "", view.error
        return dict(view.pods)

    pods = asyncio.run(look())
    for ip, pod in PODS.items():
        got = pods[f"uid-{pod}"]
        assert got.sample is not None, got  # type: ignore[attr-defined]
        direct = parse_metrics(BODIES[ip].decode(), 0.0, "pdworker")
        assert replace(got.sample, at=0.0) == direct  # type: ignore[attr-defined]
    # The decode's values are its own, not those of the other tenant's pod of the same name
    # (which Prometheus scrapes at the prefill's address).
    decode = pods["uid-pd-decode-0"].sample  # type: ignore[attr-defined]
    assert decode.completed == 8  # the prefill's body says 7
    assert "up is not 1" in pods["uid-pd-decode-1"].direct  # type: ignore[attr-defined]
