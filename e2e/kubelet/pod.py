"""One pod's life on the local kubelet: prepare, run containers, report status, terminate.

Why: each pod is driven by one asyncio task that wakes on pod updates, process exits and probe
changes, then re-derives what to do from the latest pod object (level-based, like the real
kubelet's pod workers): start or restart containers, patch pods/status when it materially changed,
and on deletion stop the processes within the grace period and make the final delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import status as pstatus
from .apiclient import Api, ApiError, Credentials
from .container import Container
from .images import ImageNotMapped, runner_for
from .launch import base_env, build_launch, container_env
from .nodes import now_iso
from .podips import IpAllocator
from .volumes import ConfigError, VolumeSet, request_token, write_file

log = logging.getLogger("kubelet.pod")


@dataclass
class PodContext:
    """What a pod worker needs from the kubelet."""

    api: Api
    creds: Credentials
    state_dir: Path
    node_allocatable: dict[str, str]
    allocator: IpAllocator
    host_ip: str
    kubectl: str | None
    pass_env: list[str]
    backoff: tuple[float, float]


def pod_dir_for(state_dir: Path, ns: str, name: str, uid: str) -> Path:
    return state_dir / "pods" / ns / name / uid


class PodWorker:
    def __init__(self, ctx: PodContext, pod: dict[str, Any]) -> None:
        self.ctx = ctx
        self.pod = pod
        m = pod["metadata"]
        self.uid: str = m["uid"]
        self.label = f"{m['namespace']}/{m['name']}"
        self.dir = pod_dir_for(ctx.state_dir, m["namespace"], m["name"], self.uid)
        self.changed = asyncio.Event()
        self.gone = False
        self.pod_ip = ""
        self.start_time = ((pod.get("status") or {}).get("startTime")) or now_iso()
        self.volumes = VolumeSet(pod, self.dir / "volumes")
        self.prepared = False
        self.terminal = False
        self.last_reported: Any = None
        self.env: dict[str, str] = {}
        self.last_warning = ""
        self.shutdown_grace = 2.0  # when the kubelet itself stops
        grace = float(pod["spec"].get("terminationGracePeriodSeconds") or 30)
        self.init = [self._container(c, grace) for c in pod["spec"].get("initContainers") or []]
        self.main = [self._container(c, grace) for c in pod["spec"].get("containers") or []]
        self.task = asyncio.create_task(self._run(), name=f"pod {self.label}")

    def _container(self, spec: dict[str, Any], grace: float) -> Container:
        c = Container(spec, self.label, self.dir, self.changed.set, self.ctx.backoff)
        c.grace = grace
        return c

    def update(self, pod: dict[str, Any]) -> None:
        if self.pod_ip:
            # The pod IP is the kubelet's own field. A watch event can carry an object written
            # before our first status report (the operator sets a decode pod's serving condition
            # at once): keep the IP, or a container started now gets POD_IP="" and binds
            # 127.0.0.1 while its probes go to the pod IP (seen as decode pods never Ready).
            st = pod.setdefault("status", {})
            if not st.get("podIP"):
                st["podIP"] = self.pod_ip
                st["podIPs"] = [{"ip": self.pod_ip}]
                st.setdefault("hostIP", self.ctx.host_ip)
        self.pod = pod
        self.volumes.pod = pod
        self.changed.set()

    def deleted(self) -> None:
        """The pod object is gone from the API (final delete, or force-deleted by someone)."""
        self.gone = True
        self.changed.set()

    # -- main loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self.changed.clear()
                if self.gone or self.pod["metadata"].get("deletionTimestamp"):
                    await self._terminate()
                    return
                try:
                    await self._step()
                except ApiError as e:
                    log.warning("%s: %s", self.label, e)
                timeout = self._next_wake()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.CancelledError:
            await self._stop_all(grace=self.shutdown_grace)
            raise
        except Exception:
            log.exception("%s: pod worker crashed", self.label)
            await self._stop_all(grace=2.0)
        finally:
            if self.gone:
                self.ctx.allocator.release(self.uid)

    def _next_wake(self) -> float:
        now = time.monotonic()
        waits = [c.next_start - now for c in self.init + self.main if not c.running and c.runs]
        waits.append(self.volumes.refresh_at - time.time())
        return max(0.2, min([10.0, *[w for w in waits if w > 0]]))

    async def _step(self) -> None:
        if not self.prepared:
            await self._prepare()
        elif time.time() >= self.volumes.refresh_at:
            await self.volumes.refresh(self.ctx.api)  # tokens, rotated Secrets
        if self.prepared and not self.terminal:
            initialized = await self._run_init()
            if initialized:
                await self._run_main()
        await self._report()

    async def _prepare(self) -> None:
        status = self.pod.get("status") or {}
        if self.pod["spec"].get("hostNetwork"):
            self.pod_ip = self.ctx.host_ip
        else:
            self.pod_ip = self.ctx.allocator.allocate(self.uid, status.get("podIP"))
        self.pod.setdefault("status", {})["podIP"] = self.pod_ip
        self.pod["status"]["podIPs"] = [{"ip": self.pod_ip}]
        self.pod["status"]["hostIP"] = self.ctx.host_ip
        for c in self.init + self.main:
            try:
                runner_for(c.image)
            except ImageNotMapped as e:
                self._warn_once(str(e))
                c.wait_reason("ImageNotMapped", str(e))
                return
        try:
            (self.dir / "home").mkdir(parents=True, exist_ok=True)
            await self.volumes.materialise(self.ctx.api)
            self.env = base_env(self.pod, self.dir, self.ctx.pass_env)
            await self._service_account_kubeconfig()
        except ConfigError as e:
            for c in self.init + self.main:
                c.wait_reason("CreateContainerConfigError", str(e))
            self._warn_once(str(e))
            return
        self.prepared = True
        log.info(
            "%s: prepared on %s with pod IP %s",
            self.label,
            self.pod["spec"].get("nodeName"),
            self.pod_ip,
        )

    def _warn_once(self, message: str) -> None:
        if message != self.last_warning:
            log.warning("%s: %s", self.label, message)
            self.last_warning = message

    async def _service_account_kubeconfig(self) -> None:
        """A kubeconfig for the pod's ServiceAccount token, exported as KUBECONFIG."""
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return
        token_file = self.volumes.token_file()
        if token_file is None:
            if spec.get("automountServiceAccountToken") is not True:
                return
            token, refresh = await request_token(self.ctx.api, self.pod, None, 3607)
            token_file = str(self.dir / "serviceaccount" / "token")
            write_file(Path(token_file), token.encode(), 0o600)
            self.volumes.refresh_at = min(self.volumes.refresh_at, refresh)
        cluster: dict[str, Any] = {"server": self.ctx.creds.server}
        if self.ctx.creds.ca_pem:
            cluster["certificate-authority-data"] = self.ctx.creds.ca_b64()
        if not self.ctx.creds.verify:
            cluster["insecure-skip-tls-verify"] = True
        ns = self.pod["metadata"]["namespace"]
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "serviceaccount", "user": {"tokenFile": token_file}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "local", "user": "serviceaccount", "namespace": ns},
                }
            ],
            "current-context": "pod",
        }
        path = self.dir / "kubeconfig"
        write_file(path, yaml.safe_dump(kubeconfig).encode(), 0o600)
        self.env["KUBECONFIG"] = str(path)

    async def _launch(self, c: Container) -> None:
        try:
            env = await container_env(
                self.ctx.api, self.pod, c.spec, self.env, self.ctx.node_allocatable
            )
            launch = build_launch(
                c.spec,
                env,
                self.volumes.mounts(c.spec),
                self.dir,
                self.ctx.kubectl,
                host_env=self.env,
            )
        except (ConfigError, ImageNotMapped) as e:
            reason = (
                "ImageNotMapped" if isinstance(e, ImageNotMapped) else "CreateContainerConfigError"
            )
            c.wait_reason(reason, str(e))
            self._warn_once(f"{c.name}: {e}")
            c.next_start = time.monotonic() + 5
            return
        except FileNotFoundError as e:
            c.wait_reason("RunContainerError", str(e))
            self._warn_once(f"{c.name}: {e}")
            c.next_start = time.monotonic() + 5
            return
        await c.start(launch, self.pod_ip)

    def _should_restart(self, c: Container) -> bool:
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        code = c.last_term.get("exitCode", 0)
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    async def _run_init(self) -> bool:
        for c in self.init:
            if c.running:
                return False
            if c.runs and c.last_term.get("exitCode") == 0:
                continue
            if (
                c.runs
                and not self._should_restart(c)
                and (self.pod["spec"].get("restartPolicy") == "Never")
            ):
                return False  # failed for good; phase says Failed via init status
            if time.monotonic() >= c.next_start:
                await self._launch(c)
            else:
                c.mark_backoff()
            return False
        return True

    async def _run_main(self) -> None:
        for c in self.main:
            if c.running:
                continue
            if not c.runs or self._should_restart(c):
                if time.monotonic() >= c.next_start:
                    await self._launch(c)
                else:
                    c.mark_backoff()

    def _initialized(self) -> bool:
        return all(c.runs and not c.running and c.last_term.get("exitCode") == 0 for c in self.init)

    async def _report(self) -> None:
        initialized = self._initialized()
        init_failed = any(
            c.runs
            and not c.running
            and c.last_term.get("exitCode")
            and self.pod["spec"].get("restartPolicy") == "Never"
            for c in self.init
        )
        st = pstatus.pod_status(
            self.pod,
            containers=[c.view() for c in self.main],
            init_containers=[c.view() for c in self.init],
            initialized=initialized,
            pod_ip=self.pod_ip if self.prepared else "",
            host_ip=self.ctx.host_ip,
            start_time=self.start_time,
            now=now_iso(),
        )
        if init_failed:
            st["phase"] = "Failed"
        if st["phase"] in ("Succeeded", "Failed") and not self.terminal:
            self.terminal = True
            log.info("%s: pod %s", self.label, st["phase"])
            await self._stop_all(
                grace=float(self.pod["spec"].get("terminationGracePeriodSeconds") or 30)
            )
        key = pstatus.material(st)
        if key == self.last_reported and not pstatus.overwritten(self.pod, st):
            return
        m = self.pod["metadata"]
        resp = await self.ctx.api.patch(
            f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}/status", {"status": st}
        )
        if resp and resp["metadata"]["uid"] == self.uid:
            self.pod = resp
            self.volumes.pod = resp
        self.last_reported = key

    # -- termination -------------------------------------------------------------------------

    async def _stop_all(self, grace: float) -> None:
        await asyncio.gather(
            *(c.stop(grace) for c in self.init + self.main), return_exceptions=True
        )

    async def _terminate(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.gone:
            grace = min(float(grace), 2.0)
        log.info("%s: terminating (grace %ss)", self.label, grace)
        await self._stop_all(float(grace))
        if not self.gone:
            with contextlib.suppress(ApiError):
                await self._report()
            try:
                await self.ctx.api.request(
                    "DELETE",
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                )
                log.info("%s: deleted", self.label)
            except ApiError as e:
                if e.status not in (404, 409):
                    log.warning("%s: final delete failed: %s", self.label, e)
        self.gone = True
