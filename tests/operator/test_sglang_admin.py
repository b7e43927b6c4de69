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
from typing import Any

import pytest
from aiohttp import web
from bench.harness import wait_for

from pdwarden.api import LedgerEntry
from pdwarden.constants import WORKER_PORT
from pdwarden.remediation import cycle
from pdwarden.remediation.act.abort_cost import PrefillQueues
from pdwarden.remediation.act.sglang_abort import (
    AbortReport,
    AdminCallError,
    SGLangAdmin,
    held_requests,
)
from pdwarden.remediation.decide import Plan, PlannedAction
from pdwarden.remediation.kinds.deployment_kind import DeploymentKind
from pdwarden.remediation.memory import DeploymentMemory
from pdwarden.remediation.scrape.samples import parse_metrics
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.remediation.seams import Round, Seen, Tools
from pdwarden.values import Target

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
    held = held_requests(parse_metrics(text + "\n", 0.0, "sglang"))
    assert (held.inflight, held.running, held.waiting) == (5, 1, None)
    # The running gauge is the prefill's last batch, already in the inflight count.
    assert AbortReport(before=held, after=None, status=200).aborted == 5


def target_of(url: str, pod: str = "p-0") -> Target:
    host, _, port = url.removeprefix("http://").partition(":")
    return Target(pod=pod, uid="u", role="prefill", ip=host, port=int(port), engine="sglang")


def admin(timeout: float = 5.0) -> SGLangAdmin:
    """The abort client as the operator builds it: gauges read through the scrape client."""
    return SGLangAdmin(WorkerClient(), timeout=timeout)


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
    report = asyncio.run(admin().abort_all(target_of(sim)))
    assert report.status == 200
    # Three wedged rooms over two dp ranks, priority totals only; the running gauge (their
    # last batch, 3) is not counted twice.
    assert report.aborted == 3
    assert report.before is not None and report.before.running == 3
    assert report.after is not None and report.after.inflight == 0
    detail = report.detail("p-0", wedged=3)
    assert detail.startswith("aborted 3 requests: 3 wedged, 0 healthy (")
    assert "abort_all=true" in detail and "inflight 3" in detail
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
                await admin().abort_all(target_of(url))
            return str(err.value)
        finally:
            await runner.cleanup()

    message = asyncio.run(go())
    assert "HTTP 401" in message and "--admin-api-key" in message


def test_an_unreachable_pod_is_an_error_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(AdminCallError):
        asyncio.run(admin(timeout=1).abort_all(target_of(f"http://127.0.0.1:{_free_port()}")))
    assert time.monotonic() - started < 10


class FakeAborter:
    """An SGLang prefill that held `held` requests; records the URLs it was called with."""

    def __init__(self, held: PrefillQueues) -> None:
        self.held = held
        self.calls: list[str] = []

    async def abort_all(
        self, target: Target, token: str | None = None, tenant: str = ""
    ) -> AbortReport:
        self.calls.append(target.base)
        return AbortReport(before=self.held, after=PrefillQueues(inflight=0), status=200)


class Recorder:
    """The API server as far as one acting half writes to it: intents and Events."""

    def __init__(self) -> None:
        self.intents: list[LedgerEntry] = []
        self.events: list[dict[str, Any]] = []

    async def intend(self, entry: LedgerEntry) -> None:
        self.intents.append(entry)

    async def create_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


NOW = datetime(2025, 1, 1, tzinfo=UTC)
ABORT = PlannedAction("AbortRequests", "pd-prefill-0", "InflightGaugeStuck: ...", room_count=3)
PREFILL = Target(pod="pd-prefill-0", uid="u", role="prefill", ip="127.0.0.9", engine="sglang")
BODY = {"apiVersion": "pdwarden.dev/v1alpha1", "kind": "PDDeployment",
        "metadata": {"name": "pd", "namespace": "ns", "uid": "pd-uid"}}  # fmt: skip


def round_with(
    fake: FakeAborter, *targets: Target, api: Recorder | None = None
) -> Round[Any, Any, Any]:
    api = api or Recorder()
    tools = Tools(client=api, workers=None, admin=None, sglang=fake, canary=None)  # type: ignore[arg-type]
    kind = DeploymentKind(client=None)  # type: ignore[arg-type]
    seen = Seen(namespace="ns", tenant="t", pods=[], workers=[],
                targets={t.uid: t for t in targets}, token=None, unjudged=frozenset(),
                decode_replicas=1)  # fmt: skip
    return Round(kind, tools, None, seen, BODY, NOW, DeploymentMemory(), api)  # type: ignore[arg-type]


def test_the_cycle_records_what_the_abort_cost() -> None:
    fake = FakeAborter(PrefillQueues(running=1, waiting=0, bootstrap=0, inflight=3))
    done = asyncio.run(cycle.perform(round_with(fake, PREFILL), ABORT, False))
    assert fake.calls == [f"http://127.0.0.9:{WORKER_PORT}"]
    assert done.rooms == 3  # the running gauge (the last batch) is already inflight
    assert done.detail.startswith("aborted 3 requests: 3 wedged, 0 healthy (")
    assert "abort_all=true on pd-prefill-0" in done.detail and "inflight 3" in done.detail

    done = asyncio.run(cycle.perform(round_with(fake), ABORT, False))
    assert done.outcome == "Skipped" and done.detail.startswith("skipped") and done.rooms == 0
    assert len(fake.calls) == 1


def test_the_ledger_entry_and_its_events_say_how_many_healthy_requests_the_abort_cost() -> None:
    """abort_all is the narrowest call SGLang 0.5.23 allows (act/sglang_abort.py): a loaded prefill
    loses its healthy requests with the wedged rooms, and the user reads how many, in the
    ledger and in the Events on the PDDeployment and the pod."""
    fake = FakeAborter(PrefillQueues(running=2, waiting=2, bootstrap=1, inflight=4))
    api = Recorder()
    r = round_with(fake, PREFILL, api=api)
    [entry] = asyncio.run(cycle.execute(r, Plan(actions=(ABORT,))))
    assert [i.outcome for i in api.intents] == ["Pending"]
    assert (entry.action, entry.outcome, entry.rooms) == ("AbortRequests", "Succeeded", 7)
    # 4 not wedged; 2 of them may be the last batch, gone already if it was /health probes.
    cost = "aborted 7 requests: 3 wedged, 2-4 healthy"
    assert entry.reason.startswith(f"InflightGaugeStuck: ...; {cost} (")
    assert [e["involvedObject"]["kind"] for e in api.events] == ["PDDeployment", "Pod"]
    for event in api.events:
        assert event["reason"] == "AbortRequests"
        assert event["message"].startswith(
            f"AbortRequests pd-prefill-0: InflightGaugeStuck: ...; {cost}"
        )


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
            target = target_of(f"http://127.0.0.1:{port}")
            report = await admin().abort_all(target, "the-key")
            assert report.status == 200
            with pytest.raises(AdminCallError):
                await admin().abort_all(target)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert seen == ["Bearer the-key", None]
