"""The operator's remediation cycle, in-process over local pods: what bench.recovery times.

`OperatorLoop` runs the operator's own scrape -> detect -> plan at the configured interval over
pdworker processes (or simulated SGLang pods) and does directly what the Kubernetes adapter would
do (bench/recovery.py's docstring says how each action maps), so no cluster is needed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench import harness
from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import PodState, plan
from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import detect, working_rooms
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import RoomView, Sample, Target

# The worker flags every scenario starts from: a tiny model, fast heartbeats.
SMALL = [
    "--layers", "2", "--heads", "2", "--head-dim", "16", "--page-size", "4", "--vocab", "1024",
    "--kv-pages", "2048", "--transfer-threads", "2", "--heartbeat-interval", "0.5",
    "--heartbeat-failures", "3", "--peer-timeout", "3", "--device", "cpu",
]  # fmt: skip


@dataclass
class SimProc:
    """A simulated pod's address (SglangPlayer): what OperatorLoop needs of a process."""

    name: str
    port: int


@dataclass
class Pod:
    proc: harness.Proc | SimProc
    role: str
    generation: int = 0
    cordoned_since: datetime | None = None
    samples: deque[Sample] = field(default_factory=deque)
    rooms: deque[tuple[float, tuple[RoomView, ...]]] = field(default_factory=deque)

    @property
    def uid(self) -> str:
        return f"{self.proc.name}-{self.generation}"


class OperatorLoop:
    """The operator's scrape -> detect -> plan -> act cycle over local worker processes."""

    def __init__(
        self,
        workers: harness.Workers | None,
        pods: list[Pod],
        spec: RemediationSpec,
        engine: str = "pdworker",
    ) -> None:
        self.w = workers
        self.engine = engine
        self.pods = pods
        self.spec = spec
        self.client = WorkerClient()
        self.ledger: list[LedgerEntry] = []
        self.events: list[dict[str, Any]] = []
        self.findings = 0
        self.finding_log: list[dict[str, Any]] = []
        self.errors: list[str] = []  # cycles that raised (the loop goes on), the first 20
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> OperatorLoop:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    async def _run(self) -> None:
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    await self.cycle()
                except Exception as exc:  # like the operator's own loop: record it, go on
                    if len(self.errors) < 20:
                        self.errors.append(
                            f"t={time.monotonic() - self.t0:.2f}: {type(exc).__name__}: {exc}"
                        )
                await asyncio.sleep(
                    max(0.0, self.spec.scrape_interval_seconds - (time.monotonic() - began))
                )
        finally:
            await self.client.close()

    async def cycle(self) -> None:
        spec = self.spec
        targets = {
            p.uid: Target(pod=p.proc.name, uid=p.uid, role=p.role, ip=harness.LOOPBACK,
                          port=p.proc.port, engine=self.engine,
                          rooms=p.role == "prefill" and self.engine == "pdworker")
            for p in self.pods
        }  # fmt: skip
        results = {
            r.target.uid: r for r in await self.client.scrape(list(targets.values()), harness.TOKEN)
        }
        keep = spec.wedge_after_seconds + 3 * spec.scrape_interval_seconds
        views, decodes = [], []
        for p in self.pods:
            r = results[p.uid]
            if r.sample is not None:
                p.samples.append(r.sample)
                while r.sample.at - p.samples[0].at > keep:
                    p.samples.popleft()
                if r.rooms is not None:
                    p.rooms.append((r.sample.at, working_rooms(r.rooms)))
                while p.rooms and r.sample.at - p.rooms[0][0] > keep:
                    p.rooms.popleft()
            stale = r.sample is None
            views.append(PodView(name=p.proc.name, role=p.role, uid=p.uid,
                                 history=tuple(p.samples), rooms=r.rooms, stale=stale,
                                 error=r.error, recent_rooms=tuple(p.rooms)))  # fmt: skip
            if p.role == "decode":
                decodes.append(PodState(p.proc.name, p.uid, ready=not stale,
                                         cordoned_since=p.cordoned_since, stale=stale))  # fmt: skip
        detection = detect(views, spec.wedge_after_seconds)
        self.findings += len(detection.findings)
        self.finding_log += [
            {"t": round(time.monotonic() - self.t0, 3), "pod": f.pod, "reason": f.reason,
             "evidence": f.evidence[:200]}
            for f in detection.findings
        ][: max(0, 50 - len(self.finding_log))]  # fmt: skip
        now = datetime.now(UTC)
        n_decodes = sum(p.role == "decode" for p in self.pods)
        decision = plan(spec, detection, decodes, self.ledger, now, decode_replicas=n_decodes)
        by_name = {p.proc.name: p for p in self.pods}
        for action in decision.actions:
            pod = by_name[action.pod]
            detail = ""
            if action.kind == "FailRooms":
                failed = await self.client.fail_rooms(targets[pod.uid], action.rooms, harness.TOKEN)
                detail = f"failed {failed} of {len(action.rooms)}"
            elif action.kind == "CordonDecode":
                pod.cordoned_since = now
            elif action.kind == "UncordonDecode":
                pod.cordoned_since = None
            elif action.kind == "RestartDecode" and self.w is not None:
                assert isinstance(pod.proc, harness.Proc)
                pod.proc = await asyncio.to_thread(self.w.restart, pod.proc)
                pod.generation += 1
                pod.cordoned_since = None  # a new pod starts without the cordon condition
                pod.samples.clear()
                pod.rooms.clear()
            self.ledger.append(LedgerEntry(time=now, action=action.kind, pod=action.pod,
                                           peer=action.peer, rooms=action.room_count,
                                           reason=action.reason[:500]))  # fmt: skip
            self.events.append(
                {"t": round(time.monotonic() - self.t0, 3), "action": action.kind,
                 "pod": action.pod, "detail": detail or action.reason[:120]}
            )  # fmt: skip


def remediation_spec(settings: dict[str, Any]) -> RemediationSpec:
    return RemediationSpec.model_validate(settings)
