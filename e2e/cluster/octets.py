"""Pod-CIDR octets claimed across local clusters, so that two running at once never share pod IPs.

The kubelet maps pod IP 10.X.N.K to 127.X.N.K: each cluster needs its own second octet X. A claim
is a file under the pdwarden cache naming the cluster's directory; it is live while that cluster
still has its state file and processes, and sockets bound on 127.X count as taken too.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from e2e.cluster.processes import STATE_FILE, ClusterError, pid_alive

OCTETS_DIR = Path(os.environ.get("PDWARDEN_CACHE", Path.home() / ".cache" / "pdwarden")) / "octets"
OCTET_RANGE = range(100, 250)


def _octet_owner_alive(lock: Path) -> bool:
    """A claim is live while the cluster that made it still has its state file and processes."""
    try:
        directory = Path(lock.read_text().strip())
    except OSError:
        return False
    state = directory / STATE_FILE
    if not state.exists():
        return False
    try:
        pids = json.loads(state.read_text()).get("pids", {})
    except ValueError:
        return False
    return any(pid_alive(pid) for pid in pids.values())


def octets_in_use() -> set[int]:
    """Second octets of 127.X.y.z addresses that local sockets are bound to right now."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            addr = line.split()[1].split(":")[0]  # little-endian hex IPv4
            if len(addr) == 8 and int(addr[6:8], 16) == 127:
                used.add(int(addr[4:6], 16))
    return used


def claim_octet(directory: Path) -> int:
    """Claim a pod-CIDR octet no other running local cluster uses (244 first, then random)."""
    OCTETS_DIR.mkdir(parents=True, exist_ok=True)
    candidates = [244, *random.sample(list(OCTET_RANGE), len(OCTET_RANGE))]
    busy = octets_in_use()
    for octet in candidates:
        lock = OCTETS_DIR / str(octet)
        if octet in busy or (lock.exists() and _octet_owner_alive(lock)):
            continue
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            lock.unlink(missing_ok=True)  # stale claim: its cluster is gone
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(directory))
        return octet
    raise ClusterError("every pod-CIDR octet is claimed by a running local cluster")


def release_octet(directory: Path) -> None:
    if not OCTETS_DIR.is_dir():
        return
    for lock in OCTETS_DIR.iterdir():
        try:
            if Path(lock.read_text().strip()) == directory:
                lock.unlink(missing_ok=True)
        except OSError:
            continue
