"""bench.recovery's wedge scenarios, each timed from its onset to the in-process repair.

The abort race (rooms stuck in prefill's inflight queue) and a stalled decode, on real pdworker
processes with their fault switches.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from e2e.httpjson import http

from bench import common, harness
from bench._recovery_loop import SMALL, OperatorLoop, Pod, remediation_spec

SLOW_FORWARD = ["--prefill-chunk-ms", "3", "--chunk-pages", "1"]
STORM = ["--clients", "30", "--cancel-fraction", "0.3", "--cancel-max-ms", "150",
         "--prompt-len", "4:64", "--output-len", "1:8", "--vocab", "1024"]  # fmt: skip


def abort_race(settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    spec = remediation_spec(settings)
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
    spec = remediation_spec(settings)
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
