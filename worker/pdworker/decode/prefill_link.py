"""Decode's side of the handshake: one `PrefillLink` per prefill bootstrap endpoint.

Registers this decode incarnation with a prefill once (NIXL agent metadata and the KV pool's
geometry as plain data), registers each room's destination pages, sends acknowledged ABORTs, and
heart-beats every known prefill: repeated failures, a new prefill incarnation, or a prefill that
no longer knows this decode all count as losing the peer, and its rooms fail at once instead of
waiting out a timeout.

Trust: decode talks only to bootstrap endpoints given as IP literals (nothing is resolved), allowed
before any connection is made (allow.py), and that prove they hold this deployment's bootstrap key
(`GET /bootstrap/info?nonce=`, answered with an HMAC bound to the address asked) before decode
sends its key (during a key rotation either key counts, `secret_file`), its NIXL metadata or the
address of its KV pool. Redirects are not followed, answers are read under a cap, connections leave
from this pod's own address (the prefill binds a peer to it), and at most MAX_PREFILL_LINKS links
are kept (least recently used idle ones are dropped). What goes wrong on a link is logged here,
with the details; the room and the client hear a fixed sentence per kind of failure (`PeerError`),
never an exception's text.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pdworker import handshake as hs
from pdworker import limits
from pdworker.config import WorkerConfig
from pdworker.contract import FAILURE_REASONS
from pdworker.handshake import AUTH_SCHEME, Refused, info_proof, parse_ip
from pdworker.model import KVPool
from pdworker.server import BadRequest
from pdworker.transfer import Transport

log = logging.getLogger(__name__)
MAX_PROOFS = 4  # proofs read from one info answer (a prefill in a key rotation sends two)


class PeerError(Exception):
    """Talking to prefill failed. `reason` is the room's failure reason; `kind` says what went
    wrong (unreachable, untrusted, refused, layout), in words fixed here: the detail of a
    connection error is logged, never handed to the room or the client."""

    def __init__(self, reason: str, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.kind = kind
        self.detail = detail

    @property
    def untrusted(self) -> bool:  # the endpoint is not a prefill of this deployment
        return self.kind == "untrusted"


def _unreachable(address: str, what: str, exc: BaseException) -> PeerError:
    log.info("prefill %s unreachable (%s): %r", address, what, exc)
    return PeerError("peer_lost", "unreachable", "the prefill could not be reached")


def endpoint(host: Any, port: Any) -> tuple[str, int]:
    """The canonical (ip, port) of a bootstrap endpoint named in /generate; BadRequest (400)
    for anything that is not an IP literal and a port (nothing is resolved)."""
    if not isinstance(host, str) or not 0 < len(host) <= 64:
        raise BadRequest("bootstrap_host must be an IP address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise BadRequest("bootstrap_port must be an integer in [1, 65535]")
    return parse_ip(host), port


def _source_address(host: str) -> tuple[str, int] | None:
    """Leave from this pod's own IP (the prefill checks it), unless bound to a wildcard."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if ip.is_unspecified else (str(ip), 0)


@dataclass
class PrefillLink:
    """What this decode knows about one prefill bootstrap endpoint."""

    address: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    registered: bool = False
    incarnation: str = ""
    agent: str = ""
    pod: str = ""
    failures: int = 0


class PrefillLinks:
    def __init__(
        self,
        cfg: WorkerConfig,
        transport: Transport,
        pool: KVPool,
        on_lost: Callable[[str, str], None],
    ) -> None:
        self.cfg = cfg
        self.transport = transport
        self.pool = pool
        self.on_lost = on_lost
        self.links: OrderedDict[str, PrefillLink] = OrderedDict()
        self.session: aiohttp.ClientSession | None = None
        self.probes = asyncio.Semaphore(limits.PREFILL_PROBES_AT_ONCE)
        self.in_use: Callable[[str], bool] = lambda _address: False

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(local_addr=_source_address(self.cfg.host))
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=10)
        )

    def admit(self, address: str) -> None:
        """Make room for a link to `address`: Refused (429) when every link is busy."""
        if address in self.links:
            self.links.move_to_end(address)
            return
        while len(self.links) >= limits.MAX_PREFILL_LINKS:
            idle = next(
                (a for a, k in self.links.items() if not k.lock.locked() and not self.in_use(a)),
                None,
            )
            if idle is None:
                raise Refused(429, f"decode is linked to {len(self.links)} prefills, all busy")
            del self.links[idle]

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def post(
        self, address: str, path: str, body: dict[str, Any], limit_s: float
    ) -> tuple[int, Any]:
        """POST under the bootstrap key: the current one, and after a 401 the one a rotation
        replaced while it is accepted (that prefill has not read the new key yet)."""
        assert self.session is not None
        keys = self.cfg.bootstrap_token.accepted()
        if not keys:
            raise PeerError("transfer_error", "refused", "decode has no bootstrap token")
        for i, key in enumerate(keys):
            async with self.session.post(
                f"http://{address}{path}",
                json=body,
                headers={"Authorization": AUTH_SCHEME + key},
                timeout=aiohttp.ClientTimeout(total=limit_s),
                allow_redirects=False,
            ) as resp:
                if resp.status == 401 and i + 1 < len(keys):
                    continue
                return resp.status, await _read_json(resp)
        raise AssertionError("unreachable: the last key's answer is returned")

    async def ensure(self, address: str) -> PrefillLink:
        self.admit(address)
        link = self.links.setdefault(address, PrefillLink(address))
        try:
            return await self._ensure(link)
        except PeerError:
            if not link.registered and self.links.get(address) is link:
                del self.links[address]  # a failed probe leaves nothing behind
            raise

    async def _ensure(self, link: PrefillLink) -> PrefillLink:
        address = link.address
        async with link.lock:
            if link.registered:
                return link
            assert self.session is not None
            keys = self.cfg.bootstrap_token.accepted()
            if not keys:
                raise PeerError("transfer_error", "refused", "decode has no bootstrap token")
            nonce = secrets.token_hex(16)
            try:
                async with (
                    self.probes,
                    self.session.get(
                        f"http://{address}{hs.INFO_PATH}",
                        params={"nonce": nonce},
                        timeout=aiohttp.ClientTimeout(total=5),
                        allow_redirects=False,
                    ) as resp,
                ):
                    info = await _read_json(resp)
                if resp.status != 200 or not _proven(info, keys, nonce, address):
                    log.warning("bootstrap endpoint %s gave no proof of the key", address)
                    raise PeerError(
                        "transfer_error",
                        "untrusted",
                        "the bootstrap endpoint is not a prefill of this deployment",
                    )
                if info.get("layout") != self.cfg.model.layout():
                    log.warning("prefill %s has another KV layout: %s", address, info.get("layout"))
                    raise PeerError("transfer_error", "layout", "KV layout mismatch with prefill")
                body = {
                    "agent": self.transport.name,
                    "pod": self.cfg.pod,
                    "address": self.cfg.address,
                    "incarnation": self.cfg.incarnation,
                    "metadata": base64.b64encode(self.transport.metadata()).decode(),
                    "layout": self.cfg.model.layout(),
                    "pool": {
                        "base_addr": self.pool.base_addr,
                        "page_bytes": self.cfg.model.page_bytes,
                        "num_pages": self.pool.num_pages,
                        "device_id": self.pool.device_id,
                        "mem_type": self.pool.mem_type,
                    },
                }
                status, data = await self.post(address, hs.PEER_PATH, body, 10)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise _unreachable(address, "registering", exc) from exc
            if status != 200:
                log.warning("prefill %s refused registration (%d): %s", address, status, data)
                raise PeerError("transfer_error", "refused", "the prefill refused this decode")
            link.registered = True
            link.incarnation = str(info.get("incarnation", ""))
            link.agent = str(info.get("agent", ""))
            link.pod = str(info.get("pod", ""))
            link.failures = 0
            return link

    async def register_room(self, link: PrefillLink, room: int, pages: list[int]) -> None:
        body = {"room": room, "agent": self.transport.name, "pages": pages}
        for attempt in range(2):
            try:
                status, data = await self.post(link.address, hs.ROOM_PATH, body, 5)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _unreachable(link.address, "registering a room", exc) from exc
            if status == 200:
                return
            if status == 409 and data.get("reason") == "peer_lost" and attempt == 0:
                self.lost(link, "prefill does not know this decode")
                link = await self._ensure(link)
                continue
            reason = (
                data.get("reason") if data.get("reason") in FAILURE_REASONS else "transfer_error"
            )
            log.info("prefill %s refused room %d (%d): %s", link.address, room, status, data)
            raise PeerError(reason, "refused", f"the prefill refused the room ({reason})")

    async def send_abort(self, address: str, room: int) -> None:
        """ABORT to prefill; returns once prefill acknowledged (its writes drained) or timed out."""
        try:
            await self.post(
                address,
                hs.ABORT_PATH,
                {"room": room, "agent": self.transport.name},
                self.cfg.abort_ack_timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("abort of room %d not acknowledged by %s: %r", room, address, exc)

    def lost(self, link: PrefillLink, why: str) -> None:
        """Forget the registration (the next room re-registers) and fail the bound rooms."""
        link.registered = False
        self.on_lost(link.address, why)

    async def heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_interval)
            for link in list(self.links.values()):
                try:
                    await self._heartbeat(link)
                except Exception:  # one link's surprise must not stop the others' heartbeats
                    log.exception("heartbeat to %s", link.address)

    async def _heartbeat(self, link: PrefillLink) -> None:
        if not link.registered:
            return
        try:
            status, data = await self.post(
                link.address,
                hs.HEARTBEAT_PATH,
                {"agent": self.transport.name},
                min(3.0, self.cfg.heartbeat_interval * 2),
            )
            if status != 200:
                raise PeerError("peer_lost", "refused", f"heartbeat answered {status}")
        except (aiohttp.ClientError, TimeoutError, PeerError) as exc:
            link.failures += 1
            log.info("heartbeat %d to %s failed: %r", link.failures, link.address, exc)
            if link.failures >= self.cfg.heartbeat_failures:
                self.lost(link, f"{link.failures} heartbeats failed")
            return
        link.failures = 0
        if data.get("incarnation") != link.incarnation:
            self.lost(link, "prefill restarted (new incarnation)")
        elif not data.get("known"):
            self.lost(link, "prefill dropped this decode")


def _proven(info: dict[str, Any], keys: tuple[str, ...], nonce: str, address: str) -> bool:
    """Whether `info` proves a key this decode accepts (a prefill answers one proof per key it
    accepts, at most MAX_PROOFS looked at: a rotation leaves two)."""
    proofs = info.get("proofs")
    if not isinstance(proofs, list):
        proofs = [info.get("proof")]
    expected = [info_proof(k, nonce, address) for k in keys]
    return any(
        isinstance(p, str) and hmac.compare_digest(p, e)
        for p in proofs[:MAX_PROOFS]
        for e in expected
    )


async def _read_json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """A JSON object answer read under a cap; {} for anything else."""
    raw = await resp.content.read(limits.BOOTSTRAP_INFO_BYTES + 1)
    if len(raw) > limits.BOOTSTRAP_INFO_BYTES:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
