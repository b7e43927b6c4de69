"""A small asyncio client for the Kubernetes REST API, with deadlines and retries built in.

Why: the kubelet is one asyncio program (processes, probes, watches), and the official client is
blocking. aiohttp gives per-call timeouts and streaming watches; the official client's kubeconfig
loader is reused so every kubeconfig flavour (token, client cert, CA file or data) works.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("kubelet.api")

RETRYABLE = {409, 429, 500, 502, 503, 504}


class ApiError(Exception):
    def __init__(self, status: int, body: str, what: str) -> None:
        self.status = status
        self.body = body
        try:
            self.reason = json.loads(body).get("reason", "")
            self.message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            self.reason, self.message = "", body
        super().__init__(f"{what}: HTTP {status} {self.message[:300]}")


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): re-list."""


@dataclass
class Credentials:
    server: str
    ca_pem: str
    headers: dict[str, str]
    cert_file: str | None
    key_file: str | None
    verify: bool

    @classmethod
    def from_kubeconfig(cls, path: str) -> Credentials:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
        ca = ""
        if cfg.ssl_ca_cert:
            with open(cfg.ssl_ca_cert) as f:
                ca = f.read()
        headers = {}
        auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if auth:
            headers["Authorization"] = auth if " " in auth else f"Bearer {auth}"
        return cls(cfg.host, ca, headers, cfg.cert_file, cfg.key_file, bool(cfg.verify_ssl))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem or None)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def ca_b64(self) -> str:
        return base64.b64encode(self.ca_pem.encode()).decode()


class Api:
    def __init__(self, creds: Credentials, timeout: float = 15.0) -> None:
        self.creds = creds
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        conn = aiohttp.TCPConnector(ssl=self.creds.ssl_context(), limit=50)
        self._session = aiohttp.ClientSession(
            base_url=self.creds.server, connector=conn, headers=self.creds.headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use `async with Api(...)`"
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        retries: int = 4,
        deadline: float | None = None,
    ) -> Any:
        """One API call with a deadline; retries 409/429/5xx and connection errors."""
        what = f"{method} {path}"
        delay = 0.2
        for attempt in range(retries + 1):
            try:
                async with self.session.request(
                    method,
                    path,
                    params=params,
                    data=None if body is None else json.dumps(body),
                    headers={"Content-Type": content_type},
                    timeout=aiohttp.ClientTimeout(total=deadline or self.timeout),
                ) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        return json.loads(text) if text else None
                    err = ApiError(resp.status, text, what)
                    if resp.status not in RETRYABLE or attempt == retries:
                        raise err
                    log.debug("retrying %s after %s", what, err)
            except (aiohttp.ClientError, TimeoutError) as e:
                if attempt == retries:
                    raise ApiError(0, f"{type(e).__name__}: {e}", what) from e
            await asyncio.sleep(delay)
            delay = min(delay * 2, 3.0)
        raise AssertionError("unreachable")

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.request("GET", path, **kw)

    async def get_or_none(self, path: str) -> Any:
        try:
            return await self.request("GET", path, retries=2)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def patch(self, path: str, body: Any, strategic: bool = True, **kw: Any) -> Any:
        ct = (
            "application/strategic-merge-patch+json"
            if strategic
            else "application/merge-patch+json"
        )
        return await self.request("PATCH", path, body=body, content_type=ct, **kw)

    async def watch(
        self, path: str, params: dict[str, str], server_timeout: int = 240
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events until the server closes the stream; raise WatchExpired on 410."""
        q = dict(params, watch="1", allowWatchBookmarks="true")
        q["timeoutSeconds"] = str(server_timeout)
        tmo = aiohttp.ClientTimeout(
            total=server_timeout + 30, connect=10, sock_read=server_timeout + 15
        )
        async with self.session.get(path, params=q, timeout=tmo) as resp:
            if resp.status == 410:
                raise WatchExpired(path)
            if resp.status >= 300:
                raise ApiError(resp.status, await resp.text(), f"WATCH {path}")
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    if event.get("object", {}).get("code") == 410:
                        raise WatchExpired(path)
                    raise ApiError(int(event["object"].get("code") or 500), line.decode(), path)
                yield event
