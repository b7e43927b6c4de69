"""Which bootstrap endpoints a decode may dial: decided before any connection is made.

Why: `POST /generate` on decode is unauthenticated and names the prefill to link to
(`bootstrap_host`, `bootstrap_port`). A decode that dialled whatever it was told was a port
scanner for anyone who reaches it: it connected, and the error text told the caller what was
there. Now an endpoint is dialled only if it is allowed here, and nothing is allowed unless the
decode was told what is:

* `--prefill-allow`: `ip:port` entries and networks (CIDR), for decodes run by hand or with a
  fixed set of prefills;
* `--prefill-selector`: the pods of this decode's own deployment (`PodPorts`: Running pods the
  label selector matches in `--namespace`, each with its IP and the container port it declares
  as `bootstrap`). This is what the operator renders for every pdworker decode, with the
  selector of the deployment's prefill pods; pod IPs are not known when a pod template is
  rendered, so the decode asks the API server (through the deployment's ServiceAccount, which
  may read pods and nothing else) every 2 s, and once more, at most every MIN_REFRESH_S, when it
  is asked for an endpoint it does not know (a prefill that just started). The allow-list is
  the API server's word about which pods carry the deployment's labels; a pod of another tenant
  in the same namespace that copied those labels would be dialled, and must then still prove it
  holds the deployment's bootstrap key before decode sends anything of its own (prefill_link).

A refused endpoint answers 403 with the same words whatever is (or is not) there, and is
counted (pdworker_decode_prefill_endpoints_refused_total{reason="not_allowed"}).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from typing import Protocol

from pdworker.handshake import parse_ip
from pdworker.server import BadRequest

MIN_REFRESH_S = 1.0
Allowed = ipaddress.IPv4Network | ipaddress.IPv6Network | tuple[str, int]


def parse_allow(entries: tuple[str, ...]) -> list[Allowed]:
    """`--prefill-allow` entries: `ip:port` or a network; ValueError names a bad entry."""
    out: list[Allowed] = []
    for raw in entries:
        entry = raw.strip()
        try:
            host, sep, port = entry.rpartition(":")
            if "/" in entry or not sep or (host.count(":") and not host.endswith("]")):
                out.append(ipaddress.ip_network(entry, strict=False))
                continue
            out.append((parse_ip(host.strip("[]")), int(port)))
        except (ValueError, BadRequest):
            raise ValueError(
                f"--prefill-allow: {entry!r} is neither ip:port nor a network"
            ) from None
    return out


class PodEndpoints(Protocol):
    """The deployment's prefill pods as (ip, bootstrap port) (discovery.PodPorts)."""

    listed: bool

    def endpoints(self) -> frozenset[tuple[str, int]]: ...

    def refresh(self) -> bool: ...

    def close(self) -> None: ...


class PrefillAllow:
    """The static entries and, if any, the deployment's prefill pods."""

    def __init__(self, static: list[Allowed], pods: PodEndpoints | None = None) -> None:
        self.static = static
        self.pods = pods
        self._refreshing: asyncio.Task[bool] | None = None
        self._refreshed = 0.0

    @property
    def configured(self) -> bool:
        return bool(self.static) or self.pods is not None

    def allows(self, ip: str, port: int) -> bool:
        if self.pods is not None and (ip, port) in self.pods.endpoints():
            return True
        address = ipaddress.ip_address(ip)
        return any(a == (ip, port) if isinstance(a, tuple) else address in a for a in self.static)

    async def admit(self, ip: str, port: int) -> bool:
        """Whether `ip:port` may be dialled; an unknown endpoint makes the pod list be read
        again first (at most every MIN_REFRESH_S, one listing at a time)."""
        if self.allows(ip, port):
            return True
        if self.pods is None:
            return False
        if self._refreshing is None and time.monotonic() - self._refreshed >= MIN_REFRESH_S:
            self._refreshed = time.monotonic()
            self._refreshing = asyncio.ensure_future(asyncio.to_thread(self.pods.refresh))
            self._refreshing.add_done_callback(self._refreshed_now)
        if self._refreshing is not None:
            with contextlib.suppress(Exception):  # (refresh logs its own failures)
                await asyncio.shield(self._refreshing)
        return self.allows(ip, port)

    def _refreshed_now(self, _: asyncio.Future[bool]) -> None:
        self._refreshing = None
