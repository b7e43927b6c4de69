"""scrape.client: whole bodies up to a cap, parsed in bounded steps, against real HTTP servers.

Every server here is a real aiohttp server on loopback; the client is the operator's own
WorkerClient. Bodies are in the exposition format SGLang serves (the fixtures of
tests/remediation/data) or deliberately pathological.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from metrics_servers import MIB, benign_body, padded_body

from pdwarden.remediation.scrape.worker_client import DEFAULT_MAX_BODY, WorkerClient
from pdwarden.values import ScrapeResult, Target


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
    assert result.sample is None and result.refused == "too_large"
    assert result.error == (
        f"http://127.0.0.1:{port}/metrics: answer of {2 * MIB} bytes is over the {MIB}-byte cap"
    )


def test_a_2_mib_body_without_a_length_over_the_cap_is_an_error() -> None:
    asyncio.run(_test_a_2_mib_body_without_a_length_over_the_cap_is_an_error())


async def _test_a_2_mib_body_without_a_length_over_the_cap_is_an_error() -> None:
    async with server(lambda: padded_body(2 * MIB), chunked=True) as port:
        result = await scrape(WorkerClient(max_body=MIB), port)
    assert result.sample is None and result.error is not None and result.refused == "too_large"
    assert f"answer over the {MIB}-byte cap (stopped at " in result.error


def test_a_cap_outside_its_bounds_is_refused() -> None:
    """Sized in test_metrics_cap.py from SGLang's own metric definitions."""
    assert DEFAULT_MAX_BODY == 4 * MIB
    with pytest.raises(ValueError, match="max_body"):
        WorkerClient(max_body=0)


def test_the_cap_is_a_flag_of_pdwarden_run() -> None:
    import argparse

    from pdwarden.run import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).max_metrics_bytes == DEFAULT_MAX_BODY
    assert parser.parse_args(["--max-metrics-bytes", "2097152"]).max_metrics_bytes == 2 * MIB
    with pytest.raises(SystemExit, match=r"--max-metrics-bytes must be 1\.\."):
        run(parser.parse_args(["--max-metrics-bytes", "0"]))


@pytest.mark.parametrize(
    ("raw", "why"),
    [(b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"{not json", "not JSON")],
)
def test_rooms_answers_that_are_not_usable_json_are_scrape_errors(raw: bytes, why: str) -> None:
    from pdwarden.remediation.scrape.samples import ScrapeError
    from pdwarden.remediation.scrape.worker_client import parse_rooms_body

    with pytest.raises(ScrapeError, match=why):
        parse_rooms_body(raw)


def test_a_closed_client_scrapes_again() -> None:
    async def twice() -> list[ScrapeResult]:
        client = WorkerClient()
        async with server(benign_body) as port:
            first = await scrape(client, port)  # closes the client
            return [first, await scrape(client, port)]

    assert [r.sample is not None for r in asyncio.run(twice())] == [True, True]
