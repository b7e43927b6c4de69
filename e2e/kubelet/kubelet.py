"""The kubelet process: nodes, one pod watch per node, pod workers, clean shutdown.

Why: this wires the pieces together and owns the rules that span pods: a watch per node scoped by
fieldSelector spec.nodeName (re-listing on 410 Gone, reconnecting with back-off on errors), pod
workers keyed by UID (a recreated StatefulSet pod is a new worker with a new IP), and shutdown that
stops every process it started before it returns.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from . import memcg, network, nodes, podips, process
from .apiclient import Api, ApiError, Credentials, WatchExpired
from .pod import PodContext, PodWorker

log = logging.getLogger("kubelet")


@dataclass
class Config:
    kubeconfig: str
    state_dir: Path
    gpu_nodes: int = 2
    cpu_nodes: int = 1
    gpus_per_node: int = 8
    node_prefix: str = ""
    pod_network: str = "loopback"
    fallback_cidr: str = "10.250.0.0/16"
    pod_cidr_wait: float = 30.0
    kubectl: str | None = None
    pass_env: list[str] = field(default_factory=lambda: ["TMPDIR", "TZ"])
    backoff_base: float = 10.0
    backoff_max: float = 300.0
    shutdown_grace: float = 5.0

    def node_specs(self) -> list[nodes.NodeSpec]:
        p = self.node_prefix
        gpu = [
            nodes.NodeSpec(f"{p}gpu-node-{i}", self.gpus_per_node) for i in range(self.gpu_nodes)
        ]
        cpu = [nodes.NodeSpec(f"{p}cpu-node-{i}", 0) for i in range(self.cpu_nodes)]
        return gpu + cpu


class Kubelet:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.creds = Credentials.from_kubeconfig(cfg.kubeconfig)
        self.specs = cfg.node_specs()
        self.workers: dict[str, PodWorker] = {}
        self.contexts: dict[str, PodContext] = {}
        self.routes_added: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        killed = process.reap_stale(self.cfg.state_dir)
        if killed:
            log.warning("killed %d process groups left by an earlier kubelet", killed)
        memcg.remove_stale()
        async with Api(self.creds) as api:
            uids = {}
            for spec in self.specs:
                node = await nodes.register(api, spec)
                uids[spec.name] = node["metadata"]["uid"]
                await nodes.renew_lease(api, spec, uids[spec.name])
            hb = asyncio.create_task(nodes.heartbeat(api, self.specs, uids, self.stop))
            try:
                for i, spec in enumerate(self.specs):
                    self.contexts[spec.name] = await self._pod_context(api, spec, i)
                watches = [asyncio.create_task(self._watch(api, s.name)) for s in self.specs]
                log.info("ready: %s", ", ".join(s.name for s in self.specs))
                await self.stop.wait()
                for w in watches:
                    w.cancel()
                await asyncio.gather(*watches, return_exceptions=True)
            finally:
                await self._shutdown(api)
                hb.cancel()

    async def _pod_context(self, api: Api, spec: nodes.NodeSpec, index: int) -> PodContext:
        cidr = await nodes.wait_pod_cidr(api, spec.name, self.cfg.pod_cidr_wait)
        if not cidr:
            base = ipaddress.IPv4Network(self.cfg.fallback_cidr)
            cidr = str(list(base.subnets(new_prefix=24))[index])
            log.warning(
                "%s has no spec.podCIDR after %.0fs (controller-manager without "
                "--allocate-node-cidrs?): using %s",
                spec.name,
                self.cfg.pod_cidr_wait,
                cidr,
            )
        spec.pod_cidr = cidr
        mode = self.cfg.pod_network
        if mode in ("auto", "local-route"):
            added = network.add_local_route(cidr)
            if added is None:
                if mode == "local-route":
                    raise SystemExit(f"cannot add a local route for {cidr} (needs CAP_NET_ADMIN)")
                log.warning(
                    "no CAP_NET_ADMIN for a local route to %s: pod IPs are mapped into "
                    "127/8, and Services get no EndpointSlice endpoints",
                    cidr,
                )
                mode = "loopback"
            else:
                mode = "local-route"
                if added:
                    self.routes_added.append(cidr)
        net = podips.map_cidr(cidr, mode)
        log.info("%s: pod CIDR %s, pod IPs from %s (%s)", spec.name, cidr, net, mode)
        return PodContext(
            api=api,
            creds=self.creds,
            state_dir=self.cfg.state_dir,
            node_allocatable=spec.capacity(),
            allocator=podips.IpAllocator(net),
            host_ip="127.0.0.1",
            kubectl=self.cfg.kubectl,
            pass_env=self.cfg.pass_env,
            backoff=(self.cfg.backoff_base, self.cfg.backoff_max),
        )

    async def _watch(self, api: Api, node: str) -> None:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        rv = ""
        delay = 0.5
        while True:
            try:
                if not rv:
                    listing = await api.get("/api/v1/pods", params=params, deadline=30)
                    rv = listing["metadata"]["resourceVersion"]
                    self._resync(node, listing["items"])
                async for event in api.watch("/api/v1/pods", dict(params, resourceVersion=rv)):
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if event["type"] == "DELETED":
                        self._deleted(obj)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._observe(node, obj)
                delay = 0.5
            except WatchExpired:
                log.info("watch on %s expired: re-listing", node)
                rv = ""
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as e:
                log.warning("watch on %s failed (%s): retrying in %.1fs", node, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _resync(self, node: str, pods: list[dict[str, Any]]) -> None:
        seen = {p["metadata"]["uid"] for p in pods}
        for uid, w in list(self.workers.items()):
            if w.pod["spec"].get("nodeName") == node and uid not in seen:
                self._deleted(w.pod)
        for p in pods:
            self._observe(node, p)

    def _observe(self, node: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is not None:
            if not worker.task.done():
                worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
            return  # finished before this kubelet started: nothing to run
        self.workers[uid] = PodWorker(self.contexts[node], pod)

    def _deleted(self, pod: dict[str, Any]) -> None:
        worker = self.workers.pop(pod["metadata"]["uid"], None)
        if worker is not None:
            worker.deleted()

    async def _shutdown(self, api: Api) -> None:
        workers = list(self.workers.values())
        log.info("stopping %d pods", len(workers))
        for w in workers:
            w.shutdown_grace = self.cfg.shutdown_grace
            w.task.cancel()
        await asyncio.gather(*(w.task for w in workers), return_exceptions=True)
        for spec in self.specs:
            try:
                await asyncio.wait_for(nodes.post_status(api, spec, False, "KubeletStopped"), 5)
            except (ApiError, TimeoutError) as e:
                log.warning("could not mark %s NotReady: %s", spec.name, e)
        for cidr in self.routes_added:
            network.remove_local_route(cidr)
