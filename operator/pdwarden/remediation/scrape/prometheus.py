"""Prometheus as the fleet's screen (prometheus mode, issue 34): one query, shared by every
object of the process, says what Prometheus's last scrape of each worker pod held.

Why: every cluster that runs these engines already runs a Prometheus scraping exactly those
pods, and scraping 5000 of them from Python every few seconds is out of reach (their bodies are
large). The screen replaces the routine scrape only: the cycle reads directly the pods it
suspects and acts on nothing but direct evidence (`remediation.screening`).

One query at a time (single flight) and at most one per `max_age` asked: 200 objects whose
cycles come due together share one answer, and a Prometheus that is down is asked once per
period, not once per object. Its answer is read to a byte cap, within a deadline, and decoded
off the event loop; whatever goes wrong becomes the view's `error`, which leaves every pod
unjudged and says why in each object's `Screened` condition.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from pdwarden import metrics
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.scrape.http1 import BodyTooLarge
from pdwarden.remediation.scrape.samples import json_answer, wanted_names
from pdwarden.remediation.scrape.screen import Screen, ScreenError, look_up, query, read_answer
from pdwarden.remediation.scrape.worker_client import read_capped
from pdwarden.values import ScreenView, Target

log = logging.getLogger("pdwarden.remediation.screen")
DEFAULT_TIMEOUT: Final = 5.0
# 5000 pods' series of the names pdwarden reads come to ~15 MB of JSON (bench/fleet.py).
DEFAULT_MAX_BYTES: Final = 128 * 1024 * 1024
# An answer serves every object that asks within this share of the age its pods' scrapes may
# reach (`cycle.SCREEN_INTERVALS`: 3 intervals): one interval, so one query per interval.
REUSE: Final = 1 / 3
# The monotonic clock is re-anchored on Prometheus's only when they drift further apart.
CLOCK_SLACK: Final = 1.0


@dataclass(frozen=True)
class PrometheusConfig:
    """Where Prometheus is and how to ask it (pdwarden run --prometheus-*)."""

    url: str
    token_file: str | None = None  # a bearer token, read again for every query (rotation)
    ca_file: str | None = None
    cert_file: str | None = None  # mTLS: the operator's client certificate and key
    key_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    max_bytes: int = DEFAULT_MAX_BYTES
    namespaces: tuple[str, ...] = ()  # the operator's scope, when it is a list of names

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the Prometheus URL must be http(s)://..., not {self.url[:80]!r}")
        if self.timeout <= 0 or self.max_bytes <= 0:
            raise ValueError("the Prometheus timeout and byte cap must be positive")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")


@dataclass(frozen=True)
class Answer:
    """One query's outcome: a screen, or why not; when it was asked (monotonic)."""

    at: float
    screen: Screen | None = None
    error: str = ""


class PrometheusScreen:
    """The process's one reader of Prometheus (`ports.ScreenApi`)."""

    def __init__(self, config: PrometheusConfig) -> None:
        self.config = config
        self.names = wanted_names()
        self.promql = query(self.names, config.namespaces)
        self._answer: Answer | None = None
        self._asking: asyncio.Task[Answer] | None = None
        self._offset: float | None = None  # monotonic = Prometheus's clock + offset
        self._session: aiohttp.ClientSession | None = None
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="pdwarden-screen")

    async def look(self, namespace: str, targets: Sequence[Target], max_age: float) -> ScreenView:
        answer = await self.answer(max_age)
        source = self.config.url
        if answer.screen is None or self._offset is None:
            return ScreenView(error=answer.error or "no answer yet", source=source)
        screen, offset = answer.screen, self._offset
        # A held answer has aged since it was asked: its pods' scrapes have too.
        left = max_age - (time.monotonic() - answer.at)
        pods = {t.uid: look_up(screen, namespace, t, max_age=left, offset=offset) for t in targets}
        return ScreenView(pods, source=source)

    async def answer(self, max_age: float) -> Answer:
        """The latest answer if it is younger than REUSE of `max_age`; else a new one is asked
        for (one query at a time, whoever asks), and while it runs a good answer younger than
        `max_age` is served without waiting: a slow query (a 5000-pod answer is ~20 MB) must not
        hold every cycle of the process. Each pod's own scrape age is checked against `max_age`
        anyway (`screen.look_up`), so an older answer can only leave pods unjudged."""
        held = self._answer
        age = math.inf if held is None else time.monotonic() - held.at
        if held is not None and age < max_age * REUSE:
            return held
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._ask())
        if held is not None and held.screen is not None and age < max_age:
            return held
        return await asyncio.shield(self._asking)

    async def _ask(self) -> Answer:
        asked = time.monotonic()
        try:
            async with asyncio.timeout(self.config.timeout):
                raw = await self._get()
                loop = asyncio.get_running_loop()
                screen = await loop.run_in_executor(self._decoder, self._decode, raw)
        except TimeoutError:
            answer = Answer(asked, error=f"no answer within {self.config.timeout:g}s")
        except BodyTooLarge as e:
            answer = Answer(asked, error=str(e))
        except (ScreenError, aiohttp.ClientError, OSError, ValueError) as e:
            answer = Answer(asked, error=sanitize.why(e) or type(e).__name__)
        else:
            now = time.monotonic()
            offset = (asked + now) / 2 - screen.evaluated_at
            if self._offset is None or abs(offset - self._offset) > CLOCK_SLACK:
                self._offset = offset
            answer = Answer(asked, screen)
        metrics.SCREEN_QUERIES.labels("ok" if answer.screen else "error").inc()
        before = self._answer
        if answer.error and (before is None or before.error != answer.error):
            log.warning("Prometheus screen (%s): %s; pods go unjudged until it answers",
                        self.config.url, answer.error)  # fmt: skip
        elif answer.screen is not None and before is not None and before.error:
            log.warning("Prometheus screen (%s) answers again", self.config.url)
        metrics.SCREEN_SECONDS.observe(time.monotonic() - asked)
        self._answer = answer
        return answer

    def _decode(self, raw: bytes) -> Screen:
        return read_answer(json_answer(raw, "Prometheus's answer", ScreenError), self.names)

    async def _get(self) -> bytes:
        cfg = self.config
        headers = {"Accept-Encoding": "identity"}
        if cfg.token_file:
            loop = asyncio.get_running_loop()
            token = await loop.run_in_executor(self._decoder, _read_token, cfg.token_file)
            headers["Authorization"] = f"Bearer {token}"
        url = cfg.url.rstrip("/") + "/api/v1/query"
        async with self.session().post(url, data={"query": self.promql}, headers=headers) as resp:
            if resp.status != 200:
                body = (await resp.content.read(512)).decode(errors="replace")
                raise ScreenError(f"{url}: HTTP {resp.status}: {sanitize.text(body, 200)}")
            return await read_capped(resp, url, cfg.max_bytes)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            cfg = self.config
            context: ssl.SSLContext | bool = True
            if cfg.url.startswith("https://") and (cfg.ca_file or cfg.cert_file):
                context = ssl.create_default_context(cafile=cfg.ca_file)
                if cfg.cert_file and cfg.key_file:
                    context.load_cert_chain(cfg.cert_file, cfg.key_file)
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=cfg.timeout),
                connector=aiohttp.TCPConnector(limit=2, ssl=context),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._asking is not None and not self._asking.done():
            self._asking.cancel()
        if self._session is not None:
            await self._session.close()
        self._decoder.shutdown(wait=False, cancel_futures=True)


def _read_token(path: str) -> str:
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token or len(token) > 16384 or any(c in token for c in "\r\n"):
        raise ScreenError(f"the token file {path} holds no usable bearer token")
    return token
