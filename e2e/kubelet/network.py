"""Make a node's pod CIDR reachable on this machine, or fall back to 127/8 addresses.

Why: the API server rejects loopback addresses in EndpointSlices (ValidateEndpointIP), so pods
with 127.x.y.z IPs never appear behind a Service. With CAP_NET_ADMIN we add a `local` route for
the pod CIDR on `lo` - exactly how Linux treats 127.0.0.0/8 - and pods keep their real 10.x IPs.
Without it we map the CIDR into 127/8 (see podips.py) and say what breaks.

The CLI currently offers only `loopback` (the local kubelet must not change the host's routes);
`Config(pod_network="auto" | "local-route")` keeps the route mode available to opt into.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shutil
import socket
import subprocess

log = logging.getLogger("kubelet.network")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)


def bindable(cidr: str) -> bool:
    """Can a process bind an address of this network (the proof the route works)?"""
    net = ipaddress.IPv4Network(cidr, strict=False)
    addr = str(net.network_address + min(2, net.num_addresses - 1))
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind((addr, 0))
        except OSError:
            return False
    return True


def add_local_route(cidr: str) -> bool | None:
    """True if we added the route, False if it was already there, None if we cannot."""
    if bindable(cidr):
        return False
    if not shutil.which("ip"):
        return None
    r = _ip("route", "add", "local", cidr, "dev", "lo", "table", "local")
    if r.returncode != 0:
        log.debug("ip route add local %s failed: %s", cidr, r.stderr.strip())
        return None
    return True if bindable(cidr) else None


def remove_local_route(cidr: str) -> None:
    r = _ip("route", "del", "local", cidr, "dev", "lo", "table", "local")
    if r.returncode != 0:
        log.warning("could not remove local route %s: %s", cidr, r.stderr.strip())
