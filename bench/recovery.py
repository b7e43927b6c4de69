"""Time to recovery from wedges: pdwarden's remediation cycle vs. the engines' own timeouts.

How, without Kubernetes: real pdworker processes on 127.0.0.1 with their fault switches, and the
operator's own remediation core run in-process at the configured interval:
`pdwarden.remediation.scrape.client` (`WorkerClient.scrape`, `fail_rooms`) ->
`pdwarden.remediation.detect.rules.detect` -> `pdwarden.remediation.policy.plan.plan`
over a ledger of `LedgerEntry`s. What the Kubernetes adapter would do is done directly: FailRooms
through the admin API (the same call), CordonDecode is recorded (a static router cannot drop the
pod, so new requests still reach it until the restart; on Kubernetes the readiness gate removes
it sooner), RestartDecode kills the decode process and starts it again with the same flags.

Scenarios, each at "default" settings (the API defaults, with maxUnavailableDecode 1 so two
decode pods may lose one) and "aggressive" ones (scrape 1 s, wedge 3 s, restart 3 s):

* abort_race: prefill with `legacy-status-race,no-inflight-watchdog` under abort storms; each
  room that stays in the inflight queue > 1 s is wedged. Per room: time from entering the
  inflight queue to gone (failed by FailRooms, its pages freed), and when the worker was clean.
* stalled_decode: one of two decodes gets `decode-stall` under steady load; time from the stall
  to the stalled decode's rooms failed and queues drained (its old incarnation's rooms gone on
  prefill) and to the decode pool whole again (restarted decode ready).
* long_prefill (aggressive only): one 6 s prefill (longer than wedgeAfterSeconds), no other
  traffic: findings and actions must be 0. Run for both engines: on pdworker processes, and on
  stock SGLang's series played by `bench._metrics_sim.SglangPlayer` (the engine is simulated,
  the exposition format is SGLang 0.5.23's): a prefill computing for three windows while its
  decode waits with a transfer queue and zero throughput, then a decode streaming one answer
  for three windows while SGLang's finish-only counters stay flat. A control phase afterwards
  wedges two rooms in the prefill inflight queue and must be found (else 0 would prove nothing).

Without pdwarden (computed from configured timeouts, not waited for): SGLang has no inflight
timeout, so abort-race rooms never leave the queue; a stalled decode is never restarted (health
stays 200); at best its waiting rooms fail after SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 300 s
(and bootstrap waits after the 300 s bootstrap timeout), if its scheduler loop still runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e.httpjson import http

from bench import common, harness
from bench._metrics_sim import SglangPlayer
from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import detect, working_rooms
from pdwarden.remediation.policy.plan import DecodePod, plan
from pdwarden.remediation.scrape.client import WorkerClient
from pdwarden.values import RoomView, Sample, Target

SMALL = [
    "--layers", "2", "--heads", "2", "--head-dim", "16", "--page-size", "4", "--vocab", "1024",
    "--kv-pages", "2048", "--transfer-threads", "2", "--heartbeat-interval", "0.5",
    "--heartbeat-failures", "3", "--peer-timeout", "3", "--device", "cpu",
]  # fmt: skip
SLOW_FORWARD = ["--prefill-chunk-ms", "3", "--chunk-pages", "1"]
STORM = ["--clients", "30", "--cancel-fraction", "0.3", "--cancel-max-ms", "150",
         "--prompt-len", "4:64", "--output-len", "1:8", "--vocab", "1024"]  # fmt: skip
SETTINGS = {
    "default": {"maxUnavailableDecode": 1},
    "aggressive": {"scrapeIntervalSeconds": 1, "wedgeAfterSeconds": 3, "restartAfterSeconds": 3,
                   "cooldownSeconds": 0, "maxUnavailableDecode": 1},
}  # fmt: skip
QUICK_SETTINGS = {
    "aggressive": {"scrapeIntervalSeconds": 1, "wedgeAfterSeconds": 2, "restartAfterSeconds": 2,
                   "cooldownSeconds": 0, "maxUnavailableDecode": 1},
}  # fmt: skip
LEGACY = {
    "abort_race_seconds": None,
    "abort_race_why": "SGLang has no inflight-queue timeout: the rooms stay forever",
    "stalled_decode_rooms_seconds": 300.0,
    "stalled_decode_rooms_why": "computed lower bound: SGLang's 300 s waiting/bootstrap timeouts,"
    " and only if the stalled scheduler still runs its timeout checks",
    "stalled_decode_pool_whole_seconds": None,
    "stalled_decode_pool_whole_why": "never: /health stays 200, nothing restarts the pod",
}


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
                decodes.append(DecodePod(p.proc.name, p.uid, ready=not stale,
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


def _spec(settings: dict[str, Any]) -> RemediationSpec:
    return RemediationSpec.model_validate(settings)


def abort_race(settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    spec = _spec(settings)
    with harness.Workers() as w:
        race = ["--fault", "legacy-status-race,no-inflight-watchdog", *SLOW_FORWARD]
        prefill = w.worker("prefill", *SMALL, *race)
        decode = w.worker("decode", *SMALL)
        router = w.router([prefill], [decode])
        w.wait_ready(prefill, decode, router)
        loop = OperatorLoop(w, [Pod(prefill, "prefill"), Pod(decode, "decode")], spec).start()
        entered: dict[int, float] = {}
        gone: dict[int, float] = {}
        watching = threading.Event()
        watching.set()

        def monitor() -> None:  # inflight entry and exit time of every room, every 0.1 s
            while watching.is_set():
                status, rooms = w.admin(prefill, "GET", "/admin/rooms")
                now = time.monotonic()
                live = set()
                if status == 200 and isinstance(rooms, list):
                    for r in rooms:
                        if r.get("phase") == "inflight":
                            live.add(r["room"])
                            entered.setdefault(r["room"], now - float(r["phase_seconds"]))
                for room in entered:
                    if room not in live and room not in gone:
                        gone[room] = now
                time.sleep(0.1)

        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        storms = 0
        try:
            while storms < (1 if quick else 8):  # storm until the race has wedged a room
                storms += 1
                w.load(router, *STORM, "--requests", "150" if quick else "600")
                time.sleep(1.2)
                now = time.monotonic()
                if any(now - t > 1.0 for r, t in entered.items() if r not in gone):
                    break
            budget = (
                spec.wedge_after_seconds + 3 * spec.scrape_interval_seconds + (10 if quick else 30)
            )
            clean_at = None
            try:
                harness.wait_for(lambda: w.clean(prefill) and w.clean(decode), budget, "clean")
                clean_at = time.monotonic()
            except TimeoutError:
                pass
            time.sleep(0.3)
        finally:
            watching.clear()
            mon.join(timeout=10)
            loop.close()
    wedged = {r: gone[r] - t for r, t in entered.items() if r in gone and gone[r] - t > 1.0}
    stuck_left = [r for r in entered if r not in gone]
    onset = min((entered[r] for r in wedged), default=None)
    return {
        "storms": storms,
        "wedged_rooms": len(wedged),
        "rooms_left_stuck": len(stuck_left),
        "room_recovery_seconds": common.stats(wedged.values()),
        "onset_to_clean_seconds": (clean_at - onset) if clean_at and onset else None,
        "actions": loop.events,
        "findings": loop.findings,
        "loop_errors": loop.errors,
    }


def stalled_decode(settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    spec = _spec(settings)
    with harness.Workers() as w:
        prefill = w.worker("prefill", *SMALL)
        stall = w.worker("decode", *SMALL, "--fault", "decode-stall", name="decode-a")
        other = w.worker("decode", *SMALL, name="decode-b")
        router = w.router([prefill], [stall, other])
        w.wait_ready(prefill, stall, other, router)
        pods = [Pod(prefill, "prefill"), Pod(stall, "decode"), Pod(other, "decode")]
        loop = OperatorLoop(w, pods, spec).start()
        load = w.load_background(router, "--clients", "4", "--duration", "900", "--timeout",
                                 "600", "--prompt-len", "8:32", "--output-len", "2:8")  # fmt: skip
        try:
            old = http("GET", f"{stall.url}/info", timeout=60)[1]["incarnation"]
            time.sleep(2 if quick else 5)  # steady load first, so the window shows progress
            onset = time.monotonic()
            status, _ = w.admin(stall, "POST", "/admin/decode-stall")
            if status != 200:
                raise RuntimeError(f"decode-stall trigger answered {status}")
            budget = spec.wedge_after_seconds + spec.restart_after_seconds + 60

            def restarted() -> bool:
                return pods[1].generation > 0

            harness.wait_for(restarted, budget, "RestartDecode", interval=0.1)

            def drained() -> bool:
                _, rooms = w.admin(prefill, "GET", "/admin/rooms")
                peers = {(r.get("peer") or {}).get("incarnation") for r in rooms}
                return old not in peers

            harness.wait_for(drained, 60, "rooms on the stalled decode gone", interval=0.1)
            drained_at = time.monotonic()

            def whole() -> bool:
                p = pods[1].proc
                return http("GET", f"{p.url}/readyz", timeout=2)[0] == 200

            harness.wait_for(whole, 120, "restarted decode ready", interval=0.1)
            whole_at = time.monotonic()
        finally:
            load.kill()
            load.wait()
            loop.close()
    return {
        "onset_to_rooms_drained_seconds": drained_at - onset,
        "onset_to_pool_whole_seconds": whole_at - onset,
        "actions": loop.events,
        "loop_errors": loop.errors,
    }


def long_prefill(settings: dict[str, Any]) -> dict[str, Any]:
    spec = _spec(settings)
    slow = ["--prefill-chunk-ms", "100", "--chunk-pages", "1"]
    with harness.Workers() as w:
        prefill = w.worker("prefill", *SMALL, *slow)
        decodes = [w.worker("decode", *SMALL, name=f"decode-{i}") for i in range(2)]
        router = w.router([prefill], decodes)
        w.wait_ready(prefill, *decodes, router)
        loop = OperatorLoop(
            w, [Pod(prefill, "prefill"), *(Pod(d, "decode") for d in decodes)], spec
        ).start()
        t0 = time.monotonic()
        try:
            status, answer = http(
                "POST", f"{router.url}/generate",
                {"input_ids": list(range(1, 4 * 60)), "max_new_tokens": 2}, timeout=120,
            )  # fmt: skip
            took = time.monotonic() - t0
            time.sleep(spec.scrape_interval_seconds * 2)
        finally:
            loop.close()
    return {
        "request_ok": status == 200 and bool(answer.get("ok")),
        "request_seconds": took,
        "findings": loop.findings,
        "actions": len(loop.events),
        "false_positives": loop.findings + len(loop.events),
        "finding_log": loop.finding_log[:10],
        "action_log": loop.events[:10],
        "loop_errors": loop.errors,
    }


def long_prefill_sglang(settings: dict[str, Any]) -> dict[str, Any]:
    """long_prefill on stock SGLang's series (simulated engine, SGLang 0.5.23's format)."""
    spec = _spec(settings)
    window = spec.wedge_after_seconds
    prefill_s = decode_s = 3.0 * window  # each three detection windows long
    t_sent = prefill_s + 1.0
    t_done = t_sent + decode_s
    control_s = window + 4.0 * spec.scrape_interval_seconds

    def timeline(pod: str, t: float) -> dict[str, float]:
        computed = 8192.0 * min(t, prefill_s)  # prompt tokens, per prefill step
        decoded = 5000.0 + 50.0 * max(0.0, min(t, t_done) - t_sent)  # per decode step
        if pod == "prefill-0":
            done = {"prefill_tokens": computed, "sent": 40 + (t >= t_sent), "finished": 40}
            if t < prefill_s:
                return {**done, "running": 1}
            if t < t_sent:
                return {**done, "inflight": 1}  # the KV transfer of the long prompt
            if t < t_done + 1.0:
                return {**done, "finished": 41}
            return {**done, "finished": 41, "inflight": 2}  # control: two rooms wedge
        if pod == "decode-0":
            common_ = {"decode_tokens": decoded, "generation_tokens_total": 8080, "finished": 120}
            if t < t_sent:  # waiting for the long prefill's KV
                return {**common_, "transfer": 1, "throughput": 0.0, "arrived": 150}
            if t < t_done:  # one long answer: finish-only counters flat
                return {**common_, "running": 1, "throughput": 50.0, "arrived": 151}
            return {"decode_tokens": decoded, "generation_tokens_total": 8080 + 50 * decode_s,
                    "finished": 121, "arrived": 151, "throughput": 0.0}  # fmt: skip
        return {"decode_tokens": 7000, "finished": 99, "arrived": 99, "throughput": 0.0}

    roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
    with SglangPlayer(roles, timeline) as player:
        pods = [Pod(SimProc(name, player.ports[name]), role) for name, role in roles.items()]
        loop = OperatorLoop(None, pods, spec, engine="sglang").start()
        try:
            time.sleep(max(0.0, t_done + 1.0 - (time.monotonic() - player.t0)))
            findings, actions = loop.findings, len(loop.events)
            time.sleep(control_s)
        finally:
            loop.close()
    return {
        "engine": "sglang (simulated: SGLang 0.5.23 exposition format, bench._metrics_sim)",
        "prefill_seconds": prefill_s,
        "decode_seconds": decode_s,
        "findings": findings,
        "actions": actions,
        "false_positives": findings + actions,
        "control_wedge_findings": loop.findings - findings,
        "loop_errors": loop.errors,
    }


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    started = time.monotonic()
    settings = QUICK_SETTINGS if quick else SETTINGS
    scenarios: dict[str, dict[str, Any]] = {}
    for label, s in settings.items():
        scenarios[label] = {
            "settings": _spec(s).model_dump(by_alias=True),
            "abort_race": abort_race(s, quick),
            "stalled_decode": stalled_decode(s, quick),
        }
    lp_label = "aggressive"
    long = {
        "pdworker": long_prefill(settings[lp_label]),
        "sglang": long_prefill_sglang(settings[lp_label]),
    }
    data = {
        "method": "real pdworker processes + the operator's scrape/detect/plan in-process "
        "(no Kubernetes; cordon recorded, restart = kill and start the process)",
        "scenarios": scenarios,
        "long_prefill_false_positives": {"settings": lp_label, **long},
        "without_pdwarden": LEGACY,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    figures = summarize(data)
    common.finish(out, "recovery", quick, readme, data, figures, lambda p: _plot(p, scenarios))
    return data


def summarize(data: dict[str, Any]) -> str:
    """The README row. In abort_race, rooms > 1 s in the inflight queue include rooms that were
    only slow under the storm; the max is the rooms that were really wedged."""
    parts = []
    for label, sc in data["scenarios"].items():
        ar, sd = sc["abort_race"], sc["stalled_decode"]
        rr = ar["room_recovery_seconds"]
        parts.append(
            f"{label}: abort-race wedged rooms cleared after max {rr['max']:.1f} s "
            f"(median {rr['median']:.1f} s over {ar['wedged_rooms']} rooms > 1 s in inflight, "
            f"{ar['rooms_left_stuck']} left); stalled decode rooms drained "
            f"{sd['onset_to_rooms_drained_seconds']:.1f} s, pool whole "
            f"{sd['onset_to_pool_whole_seconds']:.1f} s"
        )
    parts.append(
        "without pdwarden: abort-race never, stalled decode >= 300 s (computed), pool never whole"
    )
    lp = data["long_prefill_false_positives"]
    parts.append(
        f"long-prefill false positives: pdworker {lp['pdworker']['false_positives']}, "
        f"sglang {lp['sglang']['false_positives']} (control wedge found "
        f"{lp['sglang']['control_wedge_findings']} times)"
    )
    return "; ".join(parts)


def _plot(path: Path, scenarios: dict[str, Any]) -> None:
    with common.figure(path, figsize=(7, 3.6), dpi=90) as ax:
        labels, values = [], []
        for label, sc in scenarios.items():
            labels += [f"abort race\n{label}", f"stalled decode\n{label}"]
            values += [sc["abort_race"]["room_recovery_seconds"]["max"],
                       sc["stalled_decode"]["onset_to_pool_whole_seconds"]]  # fmt: skip
        labels += ["stalled decode\nSGLang timeouts\n(computed)"]
        values += [300.0]
        colors = ["tab:blue"] * (len(values) - 1) + ["tab:gray"]
        ax.bar(labels, values, color=colors)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.0f} s", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("seconds to recovery")
        ax.set_title("time to recovery (abort race without pdwarden: never)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)


def main(argv: list[str] | None = None) -> None:
    common.main(__doc__ or "", run, argv, show=lambda data: data["scenarios"], limit=4000)


if __name__ == "__main__":
    main()
