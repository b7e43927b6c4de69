"""scrape.client: whole bodies up to a cap, parsed off the event loop, against real HTTP servers.

Every server here is a real aiohttp server on loopback; the client is the operator's own
WorkerClient. Bodies are in the exposition format SGLang serves (the fixtures of
tests/remediation/data) or deliberately pathological.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from metrics_servers import MIB, benign_body, hostile_body, padded_body, serve_in_process

from pdwarden.remediation.scrape.client import DEFAULT_MAX_BODY, ScrapeResult, Target, WorkerClient

HOSTILE_PODS = 20


@asynccontextmanager
async def server(make_body: Callable[[], bytes], chunked: bool = False) -> AsyncIterator[int]:
    """A loopback HTTP server answering /metrics with make_body(); yields its port."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        data = make_body()
        if not chunked:
            return web.Response(body=data, content_type="text/plain")
        resp = web.StreamResponse()  # no Content-Length: the client must read to EOF
        resp.content_type = "text/plain"
        await resp.prepare(request)
        for i in range(0, len(data), 100_000):
            await resp.write(data[i : i + 100_000])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def target(port: int, name: str = "pod") -> Target:
    return Target(pod=name, uid=name, role="decode", ip="127.0.0.1", port=port)


async def scrape(client: WorkerClient, port: int) -> ScrapeResult:
    try:
        return await client.scrape_one(target(port), None)
    finally:
        await client.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "to-eof"])
def test_a_2_mib_body_is_read_whole_under_a_larger_cap(chunked: bool) -> None:
    asyncio.run(_test_a_2_mib_body_is_read_whole_under_a_larger_cap(chunked))


async def _test_a_2_mib_body_is_read_whole_under_a_larger_cap(chunked: bool) -> None:
    async with server(lambda: padded_body(2 * MIB), chunked) as port:
        result = await scrape(WorkerClient(max_body=4 * MIB), port)
    assert result.error is None and result.sample is not None
    # The series at the very end of the body made it: the fixture's 4 plus the tail's 7.
    assert result.sample.transfer_queue == 4 + 7
    assert result.sample.running == 24 and result.sample.generated_tokens == 1_000_000


def test_a_2_mib_body_over_the_cap_is_an_error_naming_its_size() -> None:
    asyncio.run(_test_a_2_mib_body_over_the_cap_is_an_error_naming_its_size())


async def _test_a_2_mib_body_over_the_cap_is_an_error_naming_its_size() -> None:
    async with server(lambda: padded_body(2 * MIB)) as port:
        result = await scrape(WorkerClient(max_body=MIB), port)
    assert result.sample is None
    assert result.error == (
        f"http://127.0.0.1:{port}/metrics: answer of {2 * MIB} bytes is over the {MIB}-byte cap"
    )


def test_a_2_mib_body_without_a_length_over_the_cap_is_an_error() -> None:
    asyncio.run(_test_a_2_mib_body_without_a_length_over_the_cap_is_an_error())


async def _test_a_2_mib_body_without_a_length_over_the_cap_is_an_error() -> None:
    async with server(lambda: padded_body(2 * MIB), chunked=True) as port:
        result = await scrape(WorkerClient(max_body=MIB), port)
    assert result.sample is None and result.error is not None
    assert f"answer over the {MIB}-byte cap (stopped at " in result.error


def test_the_default_cap_is_about_a_mebibyte() -> None:
    assert DEFAULT_MAX_BODY == MIB
    with pytest.raises(ValueError, match="max_body"):
        WorkerClient(max_body=0)


# -- one hostile /metrics must not stall the operator (issue 13, item 3) -------------------


async def healthy_cycle_period(others: list[int], healthy_port: int) -> tuple[float, int]:
    """Mean period of another deployment's scrape cycles (one pod, 50 ms apart) while a second
    client scrapes `others` round after round; also returns how many rounds ran meanwhile."""
    healthy, busy = WorkerClient(), WorkerClient()
    rounds = 0
    stop = asyncio.Event()

    async def other_deployment() -> None:
        nonlocal rounds
        targets = [target(p, f"h-{i}") for i, p in enumerate(others)]
        while not stop.is_set():
            results = await busy.scrape(targets, None)
            assert all(r.sample is not None or r.error for r in results)
            rounds += 1

    task = asyncio.create_task(other_deployment())
    try:
        cycles, started = 0, time.monotonic()
        # Observable progress: enough cycles of ours, and at least two full rounds of theirs.
        while cycles < 10 or rounds < 2:
            result = await healthy.scrape_one(target(healthy_port), None)
            assert result.sample is not None, result.error
            assert result.sample.running == 24
            cycles += 1
            await asyncio.sleep(0.05)
        return (time.monotonic() - started) / cycles, rounds
    finally:
        stop.set()
        await task
        await healthy.close()
        await busy.close()


def test_hostile_pods_do_not_stall_another_deployments_cycles() -> None:
    """20 pods serve 1 MiB of the costliest valid input each; the baseline run scrapes 20 pods
    serving 1 MiB of benign SGLang output, so both move the same bytes and only parsing differs.
    The pods run in a process of their own, like pods elsewhere."""
    with (
        serve_in_process("benign", 1) as (healthy_port,),
        serve_in_process("benign-1mib", HOSTILE_PODS) as benign,
        serve_in_process("hostile", HOSTILE_PODS) as hostile,
    ):
        baseline, _ = asyncio.run(healthy_cycle_period(benign, healthy_port))
        attacked, rounds = asyncio.run(healthy_cycle_period(hostile, healthy_port))
    assert rounds >= 2
    # Same machine, same test, same bytes: the period stays within a small factor (0.8-1.2x
    # measured here); with the same parser on the event loop it was 4.2-4.6x, and with
    # prometheus-client's parser there the healthy scrapes timed out (loop blocked > 2 s).
    assert attacked / baseline < 2.5, (attacked, baseline)


def test_the_cap_is_a_flag_of_pdwarden_run() -> None:
    import argparse

    from pdwarden.run import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).max_metrics_bytes == DEFAULT_MAX_BODY
    assert parser.parse_args(["--max-metrics-bytes", "2097152"]).max_metrics_bytes == 2 * MIB
    with pytest.raises(SystemExit, match=r"--max-metrics-bytes must be 1\.\."):
        run(parser.parse_args(["--max-metrics-bytes", "0"]))


def test_a_parse_past_its_deadline_is_a_scrape_error() -> None:
    asyncio.run(_test_a_parse_past_its_deadline_is_a_scrape_error())


async def _test_a_parse_past_its_deadline_is_a_scrape_error() -> None:
    async with server(hostile_body) as port:
        result = await scrape(WorkerClient(parse_deadline=1e-6), port)
    assert result.sample is None and result.error == "parsing took longer than 1e-06s"


@pytest.mark.parametrize(
    ("raw", "why"),
    [(b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"{not json", "not JSON")],
)
def test_rooms_answers_that_are_not_usable_json_are_scrape_errors(raw: bytes, why: str) -> None:
    from pdwarden.remediation.scrape.client import parse_rooms_body
    from pdwarden.remediation.scrape.samples import ScrapeError

    with pytest.raises(ScrapeError, match=why):
        parse_rooms_body(raw)


def test_a_closed_client_scrapes_again() -> None:
    async def twice() -> list[ScrapeResult]:
        client = WorkerClient()
        async with server(benign_body) as port:
            first = await scrape(client, port)  # closes the client
            return [first, await scrape(client, port)]

    assert [r.sample is not None for r in asyncio.run(twice())] == [True, True]
