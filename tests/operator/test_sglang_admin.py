"""The SGLang abort call and its cost accounting, against the SIMULATED SGLang server.

The simulator (e2e/sglang_sim.py) follows SGLang 0.5.23's /abort_request and /metrics; no real
SGLang runs here (it needs GPUs). What these tests pin down is pdwarden's side: the request it
sends, how it counts what an abort_all cost from SGLang's queue gauges (priority totals, dp ranks
added, repeated tp ranks counted once), and that every failure is a clear error, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from bench.harness import wait_for

from pdwarden.remediation.act.sglang import (
    AbortReport,
    AdminCallError,
    Held,
    SGLangAdmin,
    held_requests,
)
from pdwarden.remediation.cycle import Remediator
from pdwarden.remediation.policy.plan import Action
from pdwarden.remediation.scrape.client import Target
from pdwarden.render import Owner

SIM = Path(__file__).resolve().parents[2] / "e2e" / "sglang_sim.py"
LABELS = 'engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0"'
INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"


def test_held_requests_takes_priority_totals_adds_dp_ranks_and_counts_tp_ranks_once() -> None:
    text = "\n".join([
        "# TYPE sglang:num_prefill_inflight_queue_reqs gauge",
        f'{INFLIGHT}{{{LABELS},priority="",tp_rank="0",dp_rank="0"}} 3',
        f'{INFLIGHT}{{{LABELS},priority="",tp_rank="1",dp_rank="0"}} 3',
        f'{INFLIGHT}{{{LABELS},priority="0",tp_rank="0",dp_rank="0"}} 3',
        f'{INFLIGHT}{{{LABELS},priority="",tp_rank="0",dp_rank="1"}} 2',
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{{LABELS},priority="",tp_rank="0",dp_rank="0"}} 1',
        "# TYPE sglang:gen_throughput gauge",
        f'sglang:gen_throughput{{{LABELS},priority="",tp_rank="0",dp_rank="0"}} 99',
    ])  # fmt: skip
    held = held_requests(text)
    assert (held.inflight, held.running, held.waiting) == (5, 1, None)
    assert held.total == 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sim() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SIM), "--model-path", "m", "--disaggregation-mode", "prefill",
         "--host", "127.0.0.1", "--port", str(port), "--dp-size", "2",
         "--enable-priority-scheduling", "--tp-size", "2"],
        env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                return bool(resp.status == 200)

        wait_for(ready, 30, "the simulator's /ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def test_abort_all_frees_the_wedged_rooms_and_reports_what_it_cost(sim: str) -> None:
    _post(sim + "/sim/phase", {"phase": "wedged"})
    report = asyncio.run(SGLangAdmin().abort_all(sim))
    assert report.status == 200
    assert report.aborted == 3  # three wedged rooms over two dp ranks, priority totals only
    assert report.after is not None and report.after.inflight == 0
    detail = report.detail("p-0")
    assert "abort_all=true" in detail and "3 just before" in detail and "inflight 3" in detail
    with urllib.request.urlopen(sim + "/sim/state", timeout=5) as resp:
        state = json.loads(resp.read())
    assert state["aborts"][0]["held"] == 3 and state["held"]["inflight"] == 0


async def _refusing_server(status: int) -> tuple[web.AppRunner, str]:
    async def refuse(_: web.Request) -> web.Response:
        return web.Response(status=status, text="Unauthorized")

    app = web.Application()
    app.add_routes([web.post("/abort_request", refuse), web.get("/metrics", refuse)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_a_server_with_an_api_key_is_a_clear_failure() -> None:
    async def go() -> str:
        runner, url = await _refusing_server(401)
        try:
            with pytest.raises(AdminCallError) as err:
                await SGLangAdmin().abort_all(url)
            return str(err.value)
        finally:
            await runner.cleanup()

    message = asyncio.run(go())
    assert "HTTP 401" in message and "--admin-api-key" in message


def test_an_unreachable_pod_is_an_error_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(AdminCallError):
        asyncio.run(SGLangAdmin(timeout=1).abort_all(f"http://127.0.0.1:{_free_port()}"))
    assert time.monotonic() - started < 10


class FakeAborter:
    """An SGLang prefill that held `held` requests; records the URLs it was called with."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.calls: list[str] = []

    async def abort_all(self, base_url: str) -> AbortReport:
        self.calls.append(base_url)
        return AbortReport(before=self.held, after=Held(inflight=0), status=200)


def test_the_remediator_records_what_the_abort_cost() -> None:
    fake = FakeAborter(Held(running=1, waiting=0, bootstrap=0, inflight=3))
    remediator = Remediator(client=None, workers=None, sglang=fake)  # type: ignore[arg-type]
    owner = Owner("pd", "ns", "uid")
    action = Action("AbortRequests", "pd-prefill-0", "InflightGaugeStuck: ...", room_count=3)
    target = Target(pod="pd-prefill-0", uid="u", role="prefill", ip="127.0.0.9")
    now = datetime(2025, 1, 1, tzinfo=UTC)

    detail, count = asyncio.run(remediator._perform(owner, action, target, None, now))
    assert fake.calls == ["http://127.0.0.9:8000"]
    assert count == 4
    assert "abort_all=true on pd-prefill-0" in detail and "4 just before" in detail
    assert "running 1" in detail and "inflight 3" in detail

    detail, count = asyncio.run(remediator._perform(owner, action, None, None, now))
    assert detail.startswith("skipped") and count == 0 and len(fake.calls) == 1


def test_the_admin_key_is_sent_as_sglang_checks_it() -> None:
    """SGLang 0.5.23 (srt/utils/auth.py) wants `Authorization: Bearer <admin key>` once the server
    has --admin-api-key; a PDRemediationPolicy passes the key from spec.adminTokenSecretRef."""
    seen: list[str | None] = []

    async def abort(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        ok = request.headers.get("Authorization") == "Bearer the-key"
        return web.Response(status=200 if ok else 401)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def go() -> None:
        app = web.Application()
        app.add_routes([web.post("/abort_request", abort), web.get("/metrics", metrics)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            report = await SGLangAdmin().abort_all(f"http://127.0.0.1:{port}", "the-key")
            assert report.status == 200
            with pytest.raises(AdminCallError):
                await SGLangAdmin().abort_all(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert seen == ["Bearer the-key", None]
