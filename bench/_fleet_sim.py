"""Every kwok pod's /metrics, served on its own pod IP (loopback), for the fleet bench and test.

Why: kwok runs no process, yet the operator scrapes each worker pod at its pod IP. The kwok
nodes' podCIDRs lie inside 127.0.0.0/8 (`e2e.kubelet.kwok.loopback_cidrs`), so this one aiohttp
process watches the pods (the operator's own watch code, `pdwarden.k8s.watching`) and binds
the worker port (WORKER_PORT) on each prefill/decode pod's IP while the pod has it. Bodies are
pdworker's real exposition (`WorkerMetrics`, as in `bench._metrics_sim`), idle. Prefill pods answer
`/admin/rooms` and `/admin/rooms/fail` like a pdworker (bearer token required).

A control API on 127.0.0.1 steers it and reports (JSON):
  GET  /scrapes?since=T   wall times of each pod IP's /metrics scrapes since T
  POST /wedge {ip, room}  that prefill now holds one room stuck in the inflight queue;
  GET  /wedge             when it was injected and when the operator failed it (repaired)
  POST /hostile {ip, mode: slow|huge|off, seconds}  one pod answers late or with ~1 MiB
  GET  /status            pods known, addresses bound
Never binds anything outside 127.0.0.0/8.

    python -m bench._fleet_sim --kubeconfig K [--namespace NS ...]   (prints "ready <port>")
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes import config as k8s_config

from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, WORKER_PORT
from pdwarden.k8s.watching import Batch, Watcher, WatchTarget
from pdworker.contract import PREFILL_INFLIGHT_OLDEST, PREFILL_INFLIGHT_QUEUE
from pdworker.metrics import WorkerMetrics

ROLES = ("prefill", "decode")
HUGE_BYTES = 1024 * 1024 - 4096  # just under the operator's default --max-metrics-bytes
SCRAPES_KEPT = 256


def body(role: str) -> bytes:
    m = WorkerMetrics(role, f"{role}-fleet-sim-0123456789ab")
    m.generated_tokens.inc(1000)
    m.completed.labels(role=role).inc(500)
    m.kv_bytes.inc(123456789)
    for v in (0.002, 0.01, 0.05):
        m.kv_seconds.observe(v)
    return m.render()


def wedged(body: bytes, age: float) -> bytes:
    """`body` with one room in the inflight queue, `age` seconds old (as pdworker reports it)."""
    for name, value in ((PREFILL_INFLIGHT_QUEUE, 1.0), (PREFILL_INFLIGHT_OLDEST, age)):
        line = f"\n{name} 0.0\n".encode()
        assert line in body, name
        body = body.replace(line, f"\n{name} {value}\n".encode())
    return body


def huge_body(role: str) -> bytes:
    base = body(role)
    line = b'fleet_sim_padding{series="%08d"} 1\n'
    n = (HUGE_BYTES - len(base)) // len(line % 0)
    return base + b"".join(line % i for i in range(n))


@dataclass
class Wedge:
    ip: str
    room: int
    injected: float  # wall time
    repaired: float | None = None
    fail_calls: int = 0


@dataclass
class Sim:
    port: int = WORKER_PORT
    pods: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # key->(ip, role)
    sites: dict[str, web.TCPSite] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # ip -> role
    scrapes: dict[str, deque[float]] = field(default_factory=dict)
    wedge: Wedge | None = None
    hostile: dict[str, tuple[str, float]] = field(default_factory=dict)  # ip -> (mode, secs)
    bodies: dict[str, bytes] = field(default_factory=lambda: {r: body(r) for r in ROLES})
    huge: dict[str, bytes] = field(default_factory=lambda: {r: huge_body(r) for r in ROLES})
    runner: web.AppRunner | None = None
    pending: asyncio.Queue[None] = field(default_factory=asyncio.Queue)

    # -- the pods ----------------------------------------------------------------------------

    def deliver(self, target: WatchTarget, batch: Batch) -> None:
        for event, obj in batch:
            if event == "SYNC":
                keep = {_key(o) for o in obj["items"]}
                for key in [k for k in self.pods if k not in keep and _in(k, target)]:
                    del self.pods[key]
                for o in obj["items"]:
                    self._pod(o)
            elif event == "DELETED":
                self.pods.pop(_key(obj), None)
            else:
                self._pod(obj)
        self.pending.put_nowait(None)

    def _pod(self, obj: dict[str, Any]) -> None:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        role = (meta.get("labels") or {}).get(LABEL_ROLE)
        ip = status.get("podIP")
        if role not in ROLES or not ip or meta.get("deletionTimestamp"):
            self.pods.pop(_key(obj), None)
        elif ipaddress.ip_address(ip).is_loopback:
            self.pods[_key(obj)] = (ip, role)

    async def bind_loop(self) -> None:
        """Bind the IPs pods have, release those none has (after a batch of events)."""
        while True:
            await self.pending.get()
            wanted = {ip: role for ip, role in self.pods.values()}
            for ip in [ip for ip in self.sites if ip not in wanted]:
                await self.sites.pop(ip).stop()
                self.roles.pop(ip, None)
            for ip, role in wanted.items():
                self.roles[ip] = role
                if ip not in self.sites:
                    assert ipaddress.ip_address(ip).is_loopback
                    assert self.runner is not None
                    site = web.TCPSite(self.runner, ip, self.port, backlog=512)
                    try:
                        await site.start()
                    except OSError as e:
                        print(f"fleet-sim: cannot bind {ip}:{self.port}: {e}", file=sys.stderr)
                        continue
                    self.sites[ip] = site

    # -- what the operator sees -------------------------------------------------------------

    @staticmethod
    def host(request: web.Request) -> str:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        return str(sock[0]) if sock else ""

    async def metrics(self, request: web.Request) -> web.Response:
        ip = self.host(request)
        self.scrapes.setdefault(ip, deque(maxlen=SCRAPES_KEPT)).append(time.time())
        role = self.roles.get(ip, "decode")
        mode, seconds = self.hostile.get(ip, ("off", 0.0))
        if mode == "slow":
            await asyncio.sleep(seconds)
        data = self.huge[role] if mode == "huge" else self.bodies[role]
        if self._rooms(ip):  # a pdworker's inflight gauges count the room its rooms list shows
            data = wedged(data, time.time() - self.wedge.injected)  # type: ignore[union-attr]
        return web.Response(body=data, content_type="text/plain")

    def _rooms(self, ip: str) -> list[dict[str, Any]]:
        w = self.wedge
        if w is None or w.ip != ip or w.repaired is not None:
            return []
        age = time.time() - w.injected
        return [{"room": w.room, "role": "prefill", "state": "Transferring", "phase": "inflight",
                 "phase_seconds": age, "age_seconds": age, "peer": {}}]  # fmt: skip

    async def rooms(self, request: web.Request) -> web.Response:
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return web.json_response({"error": "no token"}, status=401)
        return web.json_response(self._rooms(self.host(request)))

    async def fail(self, request: web.Request) -> web.Response:
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return web.json_response({"error": "no token"}, status=401)
        ip, wanted = self.host(request), (await request.json()).get("rooms") or []
        w, failed = self.wedge, []
        if w is not None and w.ip == ip and w.repaired is None and w.room in wanted:
            w.repaired, failed = time.time(), [w.room]
        if w is not None and w.ip == ip:
            w.fail_calls += 1
        return web.json_response({"failed": failed})

    # -- the control API ---------------------------------------------------------------------

    async def get_scrapes(self, request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        out = {ip: [t for t in ts if t >= since] for ip, ts in self.scrapes.items()}
        return web.json_response({"now": time.time(), "scrapes": out})

    async def post_wedge(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.wedge = Wedge(str(data["ip"]), int(data["room"]), time.time())
        return web.json_response({"injected": self.wedge.injected})

    async def get_wedge(self, _: web.Request) -> web.Response:
        w = self.wedge
        return web.json_response(None if w is None else w.__dict__)

    async def post_hostile(self, request: web.Request) -> web.Response:
        data = await request.json()
        if data.get("mode", "off") == "off":
            self.hostile.pop(str(data["ip"]), None)
        else:
            self.hostile[str(data["ip"])] = (str(data["mode"]), float(data.get("seconds", 0)))
        return web.json_response({"hostile": self.hostile})

    async def status(self, _: web.Request) -> web.Response:
        return web.json_response({"pods": len(self.pods), "bound": len(self.sites)})


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _in(key: tuple[str, str], target: WatchTarget) -> bool:
    return not target.namespace or key[0] == target.namespace


async def serve(kubeconfig: str, namespaces: list[str], port: int) -> None:
    sim = Sim(port=port)
    pods = web.Application()
    pods.router.add_get("/metrics", sim.metrics)
    pods.router.add_get("/admin/rooms", sim.rooms)
    pods.router.add_post("/admin/rooms/fail", sim.fail)
    sim.runner = web.AppRunner(pods, access_log=None, keepalive_timeout=75)
    await sim.runner.setup()
    control = web.Application()
    control.router.add_get("/scrapes", sim.get_scrapes)
    control.router.add_post("/wedge", sim.post_wedge)
    control.router.add_get("/wedge", sim.get_wedge)
    control.router.add_post("/hostile", sim.post_hostile)
    control.router.add_get("/status", sim.status)
    ctl = web.AppRunner(control, access_log=None)
    await ctl.setup()
    site = web.TCPSite(ctl, "127.0.0.1", 0)
    await site.start()
    ctl_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    loop = asyncio.get_running_loop()
    watchers = [
        Watcher(api, WatchTarget("v1", "Pod", ns, LABEL_DEPLOYMENT), sim.deliver, loop)
        for ns in namespaces or [""]
    ]
    for w in watchers:
        w.start()
    binder = asyncio.create_task(sim.bind_loop())
    print(f"ready {ctl_port}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until stdin closes
    for w in watchers:
        w.stop()
    binder.cancel()
    await ctl.cleanup()
    await sim.runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", action="append", default=[])
    p.add_argument("--port", type=int, default=WORKER_PORT)
    args = p.parse_args()
    asyncio.run(serve(args.kubeconfig, args.namespace, args.port))


if __name__ == "__main__":
    main()
