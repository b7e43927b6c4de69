"""Pod IP allocation: one address per pod out of its node's pod CIDR.

Why: pods run as plain processes sharing the host network, so each needs its own address to bind
the same port as its siblings. Two ways to make a pod CIDR reachable without containers:

* ``loopback``: map 10.X.N.K into 127.X.N.K (the low 24 bits of the CIDR address are kept). Linux
  routes the whole 127.0.0.0/8 to `lo`, so binding needs no setup. Catch: the API server refuses
  loopback addresses in EndpointSlices, so Services get no endpoints.
* ``local-route``: keep the real pod CIDR addresses and add a ``local`` route for each node's CIDR
  on `lo` (what 127/8 has by default). Needs CAP_NET_ADMIN; EndpointSlices then work.
"""

from __future__ import annotations

import ipaddress

# .0 is the network address, .1 the conventional gateway: real CNIs skip both.
_FIRST_HOST = 2


def map_cidr(pod_cidr: str, mode: str) -> ipaddress.IPv4Network:
    """The network pods of a node get addresses from, given the node's spec.podCIDR."""
    net = ipaddress.IPv4Network(pod_cidr, strict=False)
    if mode == "local-route":
        return net
    if mode != "loopback":
        raise ValueError(f"unknown pod network mode {mode!r}")
    if net.prefixlen < 8:
        raise ValueError(f"pod CIDR {pod_cidr} is wider than 127.0.0.0/8")
    low24 = int(net.network_address) & 0x00FFFFFF
    return ipaddress.IPv4Network((0x7F000000 | low24, net.prefixlen))


class IpAllocator:
    """Hands out host addresses of one network to pod UIDs; freed addresses are reused last."""

    def __init__(self, network: ipaddress.IPv4Network) -> None:
        self.network = network
        self._by_uid: dict[str, ipaddress.IPv4Address] = {}
        self._next = _FIRST_HOST

    def allocate(self, uid: str, preferred: str | None = None) -> str:
        if uid in self._by_uid:
            return str(self._by_uid[uid])
        used = set(self._by_uid.values())
        if preferred:
            addr = ipaddress.IPv4Address(preferred)
            if addr in self.network and addr not in used and self._offset(addr) >= _FIRST_HOST:
                self._by_uid[uid] = addr
                return preferred
        size = self.network.num_addresses - 1  # exclude the broadcast address
        span = size - _FIRST_HOST
        for i in range(span):
            offset = _FIRST_HOST + (self._next - _FIRST_HOST + i) % span
            addr = self.network.network_address + offset
            if addr not in used:
                self._by_uid[uid] = addr
                self._next = offset + 1
                return str(addr)
        raise RuntimeError(f"pod network {self.network} is full ({len(used)} pods)")

    def release(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def in_use(self) -> dict[str, str]:
        return {uid: str(a) for uid, a in self._by_uid.items()}

    def _offset(self, addr: ipaddress.IPv4Address) -> int:
        return int(addr) - int(self.network.network_address)
