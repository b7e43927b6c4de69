"""scrape.prometheus: the process's one reader of Prometheus, against an HTTP server on loopback
that answers as scripted (garbage, slowly, hugely, with an error status) and counts what it was
asked. A real Prometheus answering the same query: tests/install/test_prometheus_screen.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pdwarden.remediation.scrape.prometheus import PrometheusConfig, PrometheusScreen
from pdwarden.remediation.scrape.screen import SCRAPED_AT
from pdwarden.values import Target
from pdworker import contract as pdw

POD = Target("pd-decode-0", "u1", "decode", "10.0.0.7", 9400, engine="pdworker")


def good(at: float = 1_800_000_000.0, age: float = 1.0) -> dict[str, Any]:
    where = {"namespace": "ns", "pod": "pd-decode-0", "instance": "10.0.0.7:9400", "job": "j"}
    result = [
        {"metric": {"__name__": pdw.DECODE_RUNNING, **where}, "value": [at, "2"]},
        {"metric": {"__name__": "up", **where}, "value": [at, "1"]},
        {"metric": {"__name__": SCRAPED_AT, **where}, "value": [at, str(at - age)]},
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


Handler = Callable[[web.Request], Any]


@asynccontextmanager
async def prometheus(handler: Handler) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    asked: list[dict[str, str]] = []

    async def query(request: web.Request) -> web.StreamResponse:
        form = await request.post()
        asked.append({"query": str(form.get("query")),
                      "auth": request.headers.get("Authorization", "")})  # fmt: skip
        result: web.StreamResponse = await handler(request)
        return result

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


def answering(data: Any, status: int = 200, delay: float = 0.0) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        body = data if isinstance(data, bytes) else json.dumps(data).encode()
        return web.Response(body=body, status=status, content_type="application/json")

    return handler


def test_one_query_serves_every_object_that_asks_within_a_third_of_its_max_age(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")

    async def main() -> None:
        async with prometheus(answering(good())) as (url, asked):
            screen = PrometheusScreen(
                PrometheusConfig(url, token_file=str(token), namespaces=("ns", "other"))
            )
            views = await asyncio.gather(*(screen.look("ns", [POD], 10.0) for _ in range(50)))
            assert len(asked) == 1  # fifty objects, one query
            assert asked[0]["auth"] == "Bearer s3cret"
            assert 'namespace=~"ns|other"' in asked[0]["query"]
            sample = views[0].pods["u1"].sample
            assert sample is not None and sample.running == 2 and not views[0].error
            await screen.look("ns", [POD], 10.0)
            assert len(asked) == 1  # within 10/3 s of it: the same answer
            await screen.look("ns", [POD], 0.001)
            assert len(asked) == 2  # an object that needs fresher asks again
            await screen.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("handler", "why"),
    [
        (answering(b"<html>proxy error</html>"), "not JSON"),
        (answering({"status": "error", "error": "many-to-many"}), "many-to-many"),
        (answering({"status": "error"}, status=503), "HTTP 503"),
        (answering(good(), delay=2.0), "no answer within 0.5s"),
        (answering(b" " * 5000), "over the 4096-byte cap"),
        (
            answering({"status": "success", "data": {"resultType": "vector", "result": [1]}}),
            "not an object",
        ),
    ],
)
def test_an_unusable_answer_leaves_every_pod_unjudged_and_says_why(
    handler: Handler, why: str
) -> None:
    async def main() -> None:
        async with prometheus(handler) as (url, _):
            screen = PrometheusScreen(PrometheusConfig(url, timeout=0.5, max_bytes=4096))
            view = await screen.look("ns", [POD], 10.0)
            assert view.pods == {} and why in view.error and view.source == url
            await screen.close()

    asyncio.run(main())


def test_a_down_prometheus_is_asked_once_per_period_not_once_per_object() -> None:
    async def main() -> None:
        async with prometheus(answering({}, status=500)) as (url, asked):
            screen = PrometheusScreen(PrometheusConfig(url))
            views = await asyncio.gather(*(screen.look("ns", [POD], 10.0) for _ in range(20)))
            assert len(asked) == 1 and all("HTTP 500" in v.error for v in views)
            await screen.close()
        closed = PrometheusScreen(PrometheusConfig(url))  # nobody listens there any more
        view = await closed.look("ns", [POD], 10.0)
        assert view.error and view.pods == {}
        await closed.close()

    asyncio.run(main())


def test_an_unreadable_token_file_is_an_answer_error_not_a_crash(tmp_path: Path) -> None:
    async def main() -> None:
        async with prometheus(answering(good())) as (url, asked):
            screen = PrometheusScreen(PrometheusConfig(url, token_file=str(tmp_path / "nope")))
            view = await screen.look("ns", [POD], 10.0)
            assert "nope" in view.error and asked == []
            await screen.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"url": "prometheus:9090"}, "http"),
        ({"url": "http://p", "timeout": 0}, "positive"),
        ({"url": "http://p", "cert_file": "c.pem"}, "needs its key"),
    ],
)
def test_a_wrong_configuration_is_refused_before_anything_runs(kwargs: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        PrometheusConfig(**kwargs)


def test_a_slow_query_does_not_hold_cycles_while_a_good_answer_is_young_enough() -> None:
    """Past a third of `max_age` a new query goes out; until it is answered, the held answer
    serves (its pods' own ages are still checked), so no cycle waits on a 20 MB answer."""
    answers = iter([(good(1_800_000_000.0, 0.0), 0.0), (good(1_800_000_009.0, 0.0), 1.5)])

    async def handler(_: web.Request) -> web.Response:
        data, delay = next(answers)
        await asyncio.sleep(delay)
        return web.json_response(data)

    async def main() -> None:
        async with prometheus(handler) as (url, asked):
            screen = PrometheusScreen(PrometheusConfig(url))
            first = await screen.look("ns", [POD], 30.0)
            await asyncio.sleep(1.1)  # the held answer ages past a third of 3 s (what is tested)
            started = asyncio.get_running_loop().time()
            held = await screen.look("ns", [POD], 3.0)  # past a third of 3 s, inside 3 s
            assert asyncio.get_running_loop().time() - started < 0.5  # not the 1.5 s query
            assert held.pods["u1"].sample == first.pods["u1"].sample  # the held answer
            # Served the held answer until the slow query is answered: wait on that, no sleep.
            deadline = asyncio.get_running_loop().time() + 10
            while (await screen.look("ns", [POD], 30.0)).pods["u1"].sample == (
                first.pods["u1"].sample
            ):
                assert asyncio.get_running_loop().time() < deadline, "never answered"
                await asyncio.sleep(0.05)
            assert len(asked) == 2
            await screen.close()

    asyncio.run(main())
