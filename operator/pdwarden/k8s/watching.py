"""List, then watch, one kind in one scope, forever: the feed of `k8s.cache.ObjectCache`.

Why a thread per watch with the official client: it is the client the operator already
authenticates with (kubeconfig, in-cluster token, its refresh), and a watch is one long blocking
read. Each thread lists once (in pages), then watches from that resourceVersion with bookmarks,
so a reconnect resumes where it left off and the API server is asked for a full LIST again only
after it answers 410 Gone (the version was compacted) or the stream broke. Events are parsed in
the thread and handed to the event loop in batches; the loop alone touches the cache.

Every read has a deadline: the server ends a watch after `timeoutSeconds` (5-10 min, randomized
like client-go's so replicas do not reconnect in step), and a stream silent for longer than
READ_TIMEOUT (bookmarks arrive about once a minute) is dropped and resumed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client as k8s

from pdwarden.k8s.client import resource_path

log = logging.getLogger("pdwarden.k8s.watching")
Obj = dict[str, Any]
PAGE: Final = 500
MIN_WATCH_SECONDS: Final = 300
READ_TIMEOUT: Final = 120.0
CONNECT_TIMEOUT: Final = 15.0
MAX_LINE: Final = 16 * 1024 * 1024  # one event; the API server's own request limit is 3 MiB
BACKOFF: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

# (event type, object) batches; ("SYNC", {"items": [...]}) carries a whole LIST.
Batch = list[tuple[str, Obj]]


class Gone(Exception):
    """The resourceVersion we watch from is too old (410): list again."""


class WatchFailed(Exception):
    """The API server refused the LIST or WATCH (status, reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status


@dataclass(frozen=True)
class WatchTarget:
    api_version: str
    kind: str
    namespace: str  # "" = every namespace
    label_selector: str


def lines(chunks: Iterator[bytes], limit: int = MAX_LINE) -> Iterator[list[bytes]]:
    """Complete lines of a chunked stream, all the lines of each chunk together; a line longer
    than `limit` is an error, never an unbounded buffer."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        if b"\n" not in chunk:
            if len(buffer) > limit:
                raise ValueError(f"watch event over {limit} bytes")
            continue
        *complete, buffer = buffer.split(b"\n")
        yield [line for line in complete if line.strip()]


class Watcher:
    """One list+watch loop in a daemon thread, delivering to `deliver` on `loop`."""

    def __init__(
        self,
        api: k8s.ApiClient,
        target: WatchTarget,
        deliver: Callable[[WatchTarget, Batch], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.api, self.target, self.deliver, self.loop = api, target, deliver, loop
        self._stop = threading.Event()
        self._response: Any = None
        self.lists = 0  # full LISTs done (first one included)
        self.watches = 0  # WATCH requests opened
        self.failure: str | None = None  # the last error, while it lasts
        t = target
        self._thread = threading.Thread(
            target=self._run, name=f"pdwarden-watch-{t.kind}-{t.namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the read in the thread (urllib3 >= 2.3)
            except Exception:
                log.debug("closing the %s watch failed", self.target.kind, exc_info=True)

    def _hand_over(self, batch: Batch) -> None:
        if batch and not self._stop.is_set():
            self.loop.call_soon_threadsafe(self.deliver, self.target, batch)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(version)
                    self.failure = None
            except Gone:
                continue  # list again, at once
            except Exception as e:
                if self._stop.is_set():
                    return
                self.failure = f"{type(e).__name__}: {e}"
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                log.warning("watch of %s failed (%s); again in %gs", self.target.kind, e, delay)
                self._stop.wait(delay)

    def _request(self, query: list[tuple[str, str]], read_timeout: float) -> Any:
        t = self.target
        path = resource_path(t.api_version, t.kind, t.namespace or None)
        method, url, headers, body, post = self.api.param_serialize(
            "GET", path, query_params=[("labelSelector", t.label_selector), *query],
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        resp = self.api.call_api(
            method, url, header_params=headers, body=body, post_params=post,
            _request_timeout=(CONNECT_TIMEOUT, read_timeout),
        )  # fmt: skip
        if not 200 <= resp.status < 300:
            data = resp.read() or b""  # type: ignore[no-untyped-call]
            raise WatchFailed(resp.status, data[:512].decode(errors="replace"))
        return resp.response  # urllib3's, not yet read

    def _list(self) -> str:
        items: list[Obj] = []
        cont = ""
        while True:
            query = [("limit", str(PAGE))] + ([("continue", cont)] if cont else [])
            raw = self._request(query, READ_TIMEOUT)
            page = json.loads(raw.data)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                break
        self.lists += 1
        self._hand_over([("SYNC", {"items": items})])
        return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One WATCH until the server ends it; returns the version to resume from."""
        timeout = MIN_WATCH_SECONDS * (1 + random.random())
        query = [("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("resourceVersion", version), ("timeoutSeconds", str(int(timeout)))]  # fmt: skip
        self._response = resp = self._request(query, READ_TIMEOUT)
        self.watches += 1
        try:
            for group in lines(resp.stream(None, decode_content=True)):
                batch: Batch = []
                for line in group:
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone()
                        raise WatchFailed(int(obj.get("code") or 0), str(obj.get("message")))
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        batch.append((kind, obj))
                self._hand_over(batch)
        finally:
            self._response = None
            resp.release_conn()
        return version
