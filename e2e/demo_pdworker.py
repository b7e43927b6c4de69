"""The pdworker demo's story: provoke two production wedges on real workers, check the repair.

Act 1 races aborts against KV transfers until rooms stick in prefill's inflight queue; act 2
stalls a decode pod behind a healthy /healthz; then the service must be whole again. Every
repair is timed from its wedge's onset, so the summary can say how long recovery took.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

from e2e.demo_clock import Clock, wait_for
from e2e.demo_load import BackgroundLoad, run_load
from e2e.demo_observe import Observer
from e2e.demo_report import merge_loads, worker_failures
from e2e.demo_setup import NAMESPACE, Setup
from e2e.pdtools import admin_token, cpu_example, http, router_url, wait_ready
from pdwarden.constants import WORKER_PORT

NAME = "demo"
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 1, 4, 5
RACE = "legacy-status-race,no-inflight-watchdog"
# The `pdworker load` bursts that race aborts against KV transfers: short prompts, 30% of the
# requests cancelled within 150 ms.
STORM = "--clients 20 --requests 80 --cancel-fraction 0.3 --cancel-max-ms 150 --prompt-len 4:64"
STORM += " --output-len 1:8"


def demo_deployment() -> dict[str, Any]:
    """The CPU example, both fault families armed, remediation tuned to act within seconds."""
    args = ["--prefill-chunk-ms", "3", "--chunk-pages", "1"]  # a window for the abort race
    return cpu_example(
        NAME,
        prefill={"replicas": 1, "env": [{"name": "PDWORKER_FAULTS", "value": RACE}], "args": args},
        decode={
            "replicas": 2,
            "args": args,
            "env": [{"name": "PDWORKER_FAULTS", "value": f"{RACE},decode-stall"}],
        },
        router={"replicas": 1},
        remediation={
            "scrapeIntervalSeconds": SCRAPE,
            "wedgeAfterSeconds": WEDGE_AFTER,
            "restartAfterSeconds": RESTART_AFTER,
            "cooldownSeconds": 2,
            "maxUnavailableDecode": 1,
            # The demo wedges on purpose, often: keep the circuit breaker out of this story.
            "maxActionsPerHour": 200,
        },
    )


class Scenario:
    def __init__(self, setup: Setup, clock: Clock) -> None:
        self.setup, self.cluster, self.clock, self.say = setup, setup.cluster, clock, clock.say
        self.marks: list[tuple[float, str]] = []  # faults injected at one moment
        self.spans: list[tuple[float, float, str]] = []  # and over a while
        self.loads: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.ttr: dict[str, float | None] = {
            "abort_race": None,
            "stalled_decode_cordoned": None,
            "stalled_decode": None,
        }
        self.after = "n/a"
        self.obs: Observer | None = None

    @property
    def observer(self) -> Observer:
        assert self.obs is not None
        return self.obs

    def pods(self, role: str) -> list[tuple[str, str]]:
        views, _ = self.observer.snapshot()
        return sorted((n, v.ip) for n, v in views.items() if v.role == role)

    def run(self) -> None:
        self.cluster.kubectl(
            "apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(demo_deployment())
        )
        self.say(
            f"applied PDDeployment {NAME}: prefill 1, decode 2, router 1 (CPU pdworker moving real "
            f"KV over NIXL/UCX); faults armed: {RACE} and decode-stall; remediation: scrape "
            f"{SCRAPE}s, wedgeAfter {WEDGE_AFTER}s, restartAfter {RESTART_AFTER}s"
        )
        self.say("waiting for the worker pods (each loads torch and NIXL) ...")
        counts = {"prefill": "1/1", "decode": "2/2", "router": "1/1"}
        wait_ready(self.cluster, NAMESPACE, counts, timeout=300, name=NAME)
        self.say("all pods Ready; the operator reports the PDDeployment Ready")
        self.token = admin_token(self.cluster, NAMESPACE, NAME)
        self.url = router_url(self.cluster, NAMESPACE, NAME)
        self.obs = Observer(self.cluster.kubeconfig, NAMESPACE, NAME, self.say).start()
        load = BackgroundLoad(self.url).start()
        self.say("steady load: 3 clients through the router; queue gauges sampled every second")
        try:
            time.sleep(5)
            self.abort_race()
            self.stalled_decode()
        finally:
            load.stop()
            self.loads.extend(load.summaries)
        try:
            self.verify()
            time.sleep(1.5)  # one more sample of the recovered state for the picture
        finally:
            self.observer.stop()

    # -- act 1 ---------------------------------------------------------------------------------

    def stuck_rooms(self, rooms_url: str) -> dict[int, float]:
        """Rooms in the inflight phase for longer than any healthy transfer takes here."""
        code, rooms = http("GET", rooms_url, token=self.token, timeout=10)
        if code != 200 or not isinstance(rooms, list):
            return {}
        now = time.time()
        return {
            r["room"]: now - r["phase_seconds"]
            for r in rooms
            if r.get("phase") == "inflight" and r.get("phase_seconds", 0) > 2.5
        }

    def abort_race(self) -> None:
        (prefill, ip), *_ = self.pods("prefill")
        rooms_url = f"http://{ip}:{WORKER_PORT}/admin/rooms"
        self.say(
            "ACT 1, the abort race: bursts of requests with 30% cancelled while their KV is in "
            "flight. With legacy-status-race an abort can resurrect a Failed room, which then "
            "waits in prefill's inflight queue forever"
        )
        stuck: dict[int, float] = {}
        began = time.time()
        attempt = 0
        while not stuck and attempt < 15:
            attempt += 1
            burst = threading.Thread(target=lambda: self.loads.append(run_load(self.url, STORM)))
            burst.start()
            while burst.is_alive() and not stuck:
                time.sleep(0.5)
                stuck = self.stuck_rooms(rooms_url)
            if not stuck:
                time.sleep(2.5)  # healthy transfers finish; what is left is wedged
                stuck = self.stuck_rooms(rooms_url)
        if not stuck:
            self.spans.append((began, time.time(), "abort bursts"))
            self.problems.append("the abort race did not wedge a room in 15 bursts")
            return
        onset = min(stuck.values())
        code, _ = http("GET", f"http://{ip}:{WORKER_PORT}/healthz", timeout=5)
        self.say(
            f"burst {attempt}: {len(stuck)} room(s) stuck in {prefill}'s inflight queue, their "
            f"transfer will never finish; /healthz still answers {code}"
        )
        burst.join()
        ended = time.time()
        self.spans.append((began, ended, "abort bursts"))

        def repaired() -> bool:  # the last burst's rooms had time to show up as stuck too
            return time.time() - ended > 3 and not self.stuck_rooms(rooms_url)

        if wait_for(repaired, WEDGE_AFTER + 30):
            self.ttr["abort_race"] = time.time() - onset
            self.say(
                f"{prefill}: no wedged room left, {self.ttr['abort_race']:.1f}s after the wedge "
                f"began (wedgeAfter {WEDGE_AFTER}s + detection + action)"
            )
        else:
            self.problems.append("wedged rooms remained in the prefill inflight queue")

    # -- act 2 ---------------------------------------------------------------------------------

    def serving_decodes(self) -> list[tuple[str, str]]:
        views, _ = self.observer.snapshot()
        return sorted(
            (n, v.ip) for n, v in views.items() if v.role == "decode" and v.ready and v.serving
        )

    def stalled_decode(self) -> None:
        # A cordon from act 1 (rooms wedging on the same decode again) is lifted first.
        whole_since: list[float] = []

        def settled() -> bool:  # both decode pods serving for 3 s in a row
            if len(self.serving_decodes()) < 2:
                whole_since.clear()
                return False
            whole_since[:] = whole_since or [time.time()]
            return time.time() - whole_since[0] >= 3

        if not wait_for(settled, 60, every=0.5):
            self.problems.append("the decode pool was not whole again after act 1")
            return
        victim, ip = self.serving_decodes()[0]
        uid = self.observer.pods[victim].uid
        self.say(
            f"ACT 2, a stalled decode: {victim} keeps accepting KV but never decodes; its "
            "/healthz stays 200, only its transfer queue shows it"
        )
        code, body = http(
            "POST", f"http://{ip}:{WORKER_PORT}/admin/decode-stall", {}, token=self.token
        )
        if code != 200:
            self.problems.append(f"could not stall {victim}: {code} {body}")
            return
        start = time.time()
        self.marks.append((start, f"decode-stall {victim}"))

        def back() -> bool:
            views, _ = self.observer.snapshot()
            v = views.get(victim)
            if self.ttr["stalled_decode_cordoned"] is None and v is not None and not v.serving:
                _, st = self.observer.snapshot()
                history = (st.get("remediation") or {}).get("history") or []
                if any(e["action"] == "CordonDecode" and e["pod"] == victim
                       and "stalled" in e.get("reason", "") for e in history):  # fmt: skip
                    self.ttr["stalled_decode_cordoned"] = time.time() - start
            return v is not None and v.uid != uid and v.ready and v.serving

        if wait_for(back, WEDGE_AFTER + RESTART_AFTER + 150, every=1):
            self.ttr["stalled_decode"] = time.time() - start
            self.say(
                f"{victim} was restarted and is serving again, {self.ttr['stalled_decode']:.1f}s "
                "after the stall began"
            )
        else:
            self.problems.append(f"{victim} was not restarted and back in service in time")

    # -- the check -----------------------------------------------------------------------------

    def verify(self) -> None:
        self.say("checking recovery: no wedge left, every pod Ready, both decode pods serving")

        def clean() -> bool:
            _, st = self.observer.snapshot()
            return st.get("phase") == "Ready" and not st.get("wedges")

        if not wait_for(clean, 60):
            _, st = self.observer.snapshot()
            self.problems.append(
                f"not clean after 60s: phase {st.get('phase')}, wedges {st.get('wedges')}"
            )
        final = run_load(self.url, "--clients 4 --requests 40 --timeout 20")
        self.loads.append(final)
        decodes = {f"http://{ip}:{WORKER_PORT}" for _, ip in self.pods("decode")}
        seen: set[str] = set()
        for i in range(24):
            try:
                code, answer = http(
                    "POST", self.url + "/generate", {"text": f"after {i}", "max_new_tokens": 4}
                )
            except OSError:
                continue
            if code == 200 and isinstance(answer, dict) and answer.get("ok"):
                seen.add(str(answer.get("decode")))
            if seen >= decodes:
                break
        self.after = (
            f"{final['completed']}/{final['requests']} requests served, "
            f"{len(seen & decodes)}/{len(decodes)} decode pods answering"
        )
        self.say(f"after recovery: {self.after}")
        if not final["completed"] == final["requests"] > 0 or not seen >= decodes:
            self.problems.append(f"service not whole after recovery: {self.after}")

    def summary(self, operator: str, where: str) -> dict[str, Any]:
        _, st = self.observer.snapshot()
        ledger = (st.get("remediation") or {}).get("history") or []
        taken = Counter(e["action"] for e in ledger
                        if not e.get("dryRun") and e.get("outcome") != "Pending")  # fmt: skip
        wedges = Counter(
            e["message"].split(" on ")[0]
            for e in self.observer.events
            if e["reason"] == "WedgeDetected"
        )
        for need in ("FailRooms", "CordonDecode", "RestartDecode"):
            if not taken[need]:
                self.problems.append(f"no {need} action was taken")
        return {
            "deployment": f"{NAMESPACE}/{NAME}",
            "cluster": where,
            "operator": operator,
            "settings": {
                "scrapeIntervalSeconds": SCRAPE,
                "wedgeAfterSeconds": WEDGE_AFTER,
                "restartAfterSeconds": RESTART_AFTER,
            },
            "load": merge_loads(self.loads),
            "worker_failures": worker_failures(self.observer.samples),
            "wedges_detected": dict(wedges),
            "actions": dict(sorted(taken.items())),
            "ledger": ledger,
            "time_to_recovery_s": {
                k: (round(v, 2) if v is not None else None) for k, v in self.ttr.items()
            },
            "after_recovery": self.after,
            "recovered": not self.problems,
            "problems": self.problems,
            "samples": len(self.observer.samples),
        }


def ledger_times(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from datetime import datetime

    out = []
    for e in ledger:
        if not e.get("dryRun"):
            t = datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
            out.append({**e, "t": t})
    return out
