"""One container's life: start, exit, restart with back-off, probes, stop.

Why: this is the part of the kubelet that turns a process's behaviour into the container status
the rest of the cluster reads (running/waiting/terminated, restartCount, ready, started), so the
rules are kept together: first restart immediate, then back-off doubling from `backoff_base` up to
`backoff_max` (reason CrashLoopBackOff), reset after a run longer than `backoff_max`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import memcg, process
from .nodes import now_iso
from .probes import ProbeSpec, ProbeState, run_probe
from .status import ContainerView

log = logging.getLogger("kubelet.container")


@dataclass
class Launch:
    """Everything resolved to start the process (argv/env/cwd after expansion and substitution)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    exec_probe_argv: dict[str, list[str]]  # probe kind -> argv for exec probes


class Container:
    def __init__(
        self,
        spec: dict[str, Any],
        pod_label: str,
        pod_dir: Path,
        wake: Callable[[], None],
        backoff: tuple[float, float],
    ) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.image: str = spec.get("image", "")
        self.pod_label = pod_label
        self.pod_dir = pod_dir
        self.wake = wake
        self.backoff_base, self.backoff_max = backoff
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.restart_count = 0
        self.runs = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.next_start = 0.0  # monotonic time before which no (re)start happens
        self.delay = 0.0
        self.started_mono = 0.0
        self.kill_reason = ""
        self.probes: dict[str, ProbeState] = {
            kind: ProbeState(ProbeSpec.parse(kind, spec[f"{kind}Probe"]))
            for kind in ("startup", "readiness", "liveness")
            if spec.get(f"{kind}Probe")
        }
        self._tasks: list[asyncio.Task[None]] = []
        self.pod_ip = ""
        self.last_term: dict[str, Any] = {}
        self.current_delay = 0.0
        self.grace = 30.0  # the pod's terminationGracePeriodSeconds, for liveness kills
        self.memory_limit = memcg.memory_limit(spec)
        self.cgroup: memcg.MemoryCgroup | None = None

    # -- views -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def started(self) -> bool:
        return self.running and (
            self.probes["startup"].result if "startup" in self.probes else True
        )

    @property
    def ready(self) -> bool:
        ready = self.probes["readiness"].result if "readiness" in self.probes else True
        return self.started and ready

    def view(self) -> ContainerView:
        cid = f"local://{self.proc.pid}" if self.proc else ""
        return ContainerView(
            self.name,
            self.image,
            self.state,
            self.last_state,
            self.ready,
            self.started,
            self.restart_count,
            cid,
        )

    def exit_code(self) -> int | None:
        t = self.state.get("terminated")
        return None if t is None else int(t["exitCode"])

    # -- transitions -------------------------------------------------------------------------

    def wait_reason(self, reason: str, message: str) -> None:
        self.state = {"waiting": {"reason": reason, "message": message}}

    async def start(self, launch: Launch, pod_ip: str) -> None:
        self.pod_ip = pod_ip
        if self.runs:
            self.restart_count += 1
            self.last_state = {"terminated": self.last_term}
        self.runs += 1
        self.kill_reason = ""
        log_path = self.pod_dir / "logs" / self.name / f"{self.restart_count}.log"
        pid_file = self.pod_dir / "pids" / f"{self.name}.pid"
        try:
            self.cgroup = self._cgroup()
            self.proc = await process.spawn(
                launch.argv, launch.env, launch.cwd, log_path, pid_file, cgroup=self.cgroup
            )
        except (OSError, subprocess.SubprocessError) as e:
            self.proc = None
            if self.cgroup is not None:
                self.cgroup.remove()
                self.cgroup = None
            t = now_iso()
            self.last_term = {
                "exitCode": 128,
                "reason": "StartError",
                "message": f"{launch.argv[0]}: {e}",
                "startedAt": t,
                "finishedAt": t,
            }
            self.state = {"terminated": self.last_term}
            log.warning("%s/%s: cannot start: %s", self.pod_label, self.name, e)
            self._schedule_restart(0.0)
            return
        self.started_mono = time.monotonic()
        self.state = {"running": {"startedAt": now_iso()}}
        log.info(
            "%s/%s: started pid %d: %s",
            self.pod_label,
            self.name,
            self.proc.pid,
            shlex.join(launch.argv)[:200].replace("\n", "\\n"),
        )
        for st in self.probes.values():
            st.successes = st.failures = 0
            st.result = st.spec.kind == "liveness"
        self._tasks = [asyncio.create_task(self._wait(self.proc))]
        self._tasks += [
            asyncio.create_task(self._probe_loop(st, launch)) for st in self.probes.values()
        ]

    def _cgroup(self) -> memcg.MemoryCgroup | None:
        if self.memory_limit is None:
            return None
        name = f"{self.pod_dir.name}.{self.name}.{self.runs}"
        return memcg.MemoryCgroup.make(name, self.memory_limit)

    async def _wait(self, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        process.signal_group(proc.pid, 9)  # the container ends when its main process does
        code = process.exit_code(rc)
        reason = "Completed" if code == 0 else "Error"
        if self.cgroup is not None:
            if code == 137 and self.cgroup.oom_kills():
                reason = "OOMKilled"  # what a real kubelet reports for the kernel's kill
            self.cgroup.remove()
            self.cgroup = None
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": self.state.get("running", {}).get("startedAt", now_iso()),
            "finishedAt": now_iso(),
            "containerID": f"local://{proc.pid}",
        }
        if self.kill_reason:
            term["message"] = self.kill_reason
        self.state = {"terminated": term}
        self.last_term = term
        ran = time.monotonic() - self.started_mono
        log.info(
            "%s/%s: pid %d exited with %d after %.1fs%s",
            self.pod_label,
            self.name,
            proc.pid,
            code,
            ran,
            f" ({self.kill_reason})" if self.kill_reason else "",
        )
        (self.pod_dir / "pids" / f"{self.name}.pid").unlink(missing_ok=True)
        self._schedule_restart(ran)
        for t in self._tasks[1:]:
            t.cancel()
        self.wake()

    def _schedule_restart(self, ran: float) -> None:
        if ran > self.backoff_max:
            self.delay = 0.0
        self.current_delay = self.delay
        self.next_start = time.monotonic() + self.delay
        self.delay = self.backoff_base if self.delay == 0 else min(self.delay * 2, self.backoff_max)

    def mark_backoff(self) -> None:
        """Between an exit and a delayed restart the container waits in CrashLoopBackOff."""
        if "terminated" in self.state and self.next_start > time.monotonic():
            self.last_state = {"terminated": self.last_term}
            self.wait_reason(
                "CrashLoopBackOff",
                f"back-off {self.current_delay:.0f}s restarting failed "
                f"container={self.name} pod={self.pod_label}",
            )

    async def _probe_loop(self, st: ProbeState, launch: Launch) -> None:
        spec = st.spec
        await asyncio.sleep(spec.initial_delay)
        while self.running:
            gated = st.spec.kind != "startup" and "startup" in self.probes
            if gated and not self.probes["startup"].result:
                await asyncio.sleep(1)
                continue
            ok, msg = await run_probe(
                spec,
                pod_ip=self.pod_ip,
                ports=self.spec.get("ports") or [],
                exec_argv=launch.exec_probe_argv.get(spec.kind),
                env=launch.env,
                cwd=launch.cwd,
            )
            changed = st.record(ok, msg)
            if spec.kind == "startup" and st.result:
                self.wake()
                return
            failed_out = not ok and st.failures >= spec.failure_threshold
            if spec.kind in ("liveness", "startup") and failed_out:
                self.kill_reason = f"{spec.kind} probe failed: {msg.strip()[:200]}"
                log.info("%s/%s: %s: restarting", self.pod_label, self.name, self.kill_reason)
                if self.proc:
                    await process.stop(self.proc, self.grace)
                return
            if changed:
                self.wake()
            await asyncio.sleep(spec.period)

    async def stop(self, grace: float) -> None:
        for t in self._tasks[1:]:
            t.cancel()
        if self.proc is not None:
            await process.stop(self.proc, grace)
        if self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await self._tasks[0]
