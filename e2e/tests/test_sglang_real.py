"""A REAL SGLang 0.5.23 prefill/decode pair on the local cluster, rendered by pdwarden (sglang).

No simulator: the local kubelet runs the `lmsysorg/sglang` image from the stock SGLang CPU venv
(e2e/sglang), the stock `sglang_router` in PD mode finds the pods through the Kubernetes API, the
prefill writes KV into the decode's pool over NIXL/UCX, and a real operator (Enforce, pdwarden's
defaults) scrapes and judges the pods. One pair serves this module (e2e/sglang/fixtures.py), in
file order:

1. a request through SGLang's PD protocol straight to the pod IPs, and one through the stock
   router: each is one real KV transfer (the prefill's `kv_transfer_latency_ms` count, which no
   health probe moves);
2. the series pdwarden's SGLang adapter reads exist on the real server with the labels it
   expects, and pdwarden, judging the pair all along, has found nothing; one pair canary sent
   with pdwarden's own sender moves the KV and the pods' counters by exactly what detection
   subtracts;
3. a healthy load through the router with a third of the clients hanging up (before the answer,
   mid-stream): no finding, no action, no pdwarden Warning Event, and every queue gauge back to
   0; opt-in before it (PDWARDEN_SGLANG_CAPACITY_SECONDS), the pair's capacity by closed client
   loops, and that the load's loops reach 90 % of it;
3b. the simulator (e2e/sglang_sim.py) exposes what the real server does (families, TYPE, HELP,
   label names), and every series pdwarden reads from the real server;
4. the prefill's scheduler frozen (SIGSTOP of `sglang::scheduler`, its HTTP server alive) with
   requests arriving: found on the prefill by the pair canary (both sides' own /health), never
   on the decode, the prefill restarted, and the pair serving through the router again;
5. the decode's scheduler frozen likewise: found dead on the decode, never on the prefill,
   cordoned, restarted, and routed to again once the stock router readmits it;
6. every process of the decode killed: left to the kubelet, the prefill never restarted (its
   failed transfers are the decode's absence: no TransfersFailing), the
   pair serving again.

Faults come from outside (e2e/sglang/faults.py): signals to the pod's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from bench.harness import free_port, wait_for
from e2e import canary_effects, capacity
from e2e.enginepair import EnginePair
from e2e.httpjson import http
from e2e.pdtools import history, pdwarden_warnings, scrape, status, wait_ready
from e2e.repair_times import record
from e2e.sglang.client import metric, pd_generate, url
from e2e.sglang.faults import freeze_scheduler, kill_server
from e2e.sglang.fixtures import RESTART_AFTER, WEDGE_AFTER
from e2e.sglang.pods import BOOTSTRAP_PORT, HTTP_PORT, STARTUP_SECONDS
from e2e.vllm.faults import thaw
from prometheus_client.parser import text_string_to_metric_families

from pdwarden.engines.sglang import METRICS, PAIR_CANARY
from pdwarden.values import Target

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.sglang]
XFERS = "sglang:kv_transfer_latency_ms_count"
SIM = Path(__file__).resolve().parents[1] / "sglang_sim.py"
# Healthy load through the stock router: seconds and client loops (PDWARDEN_SGLANG_LOAD_SECONDS
# sets a longer storm, e.g. 600 for ten minutes).
LOAD_SECONDS = float(os.environ.get("PDWARDEN_SGLANG_LOAD_SECONDS", "300"))
LOAD_LOOPS = int(os.environ.get("PDWARDEN_SGLANG_LOAD_LOOPS", "4"))
# The pair's capacity curve (e2e/capacity.py), opt-in: seconds per concurrency measured.
CAPACITY_SECONDS = float(os.environ.get("PDWARDEN_SGLANG_CAPACITY_SECONDS", "0"))
CAPACITY_LOOPS = (1, 2, 4, 8, 12)


def _router_generate(
    pair: EnginePair, text: str, tokens: int = 8, timeout: float = 180
) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}

    def routed() -> Any:
        code, answer = http("POST", pair.router + "/generate", body, timeout=120)
        # The stock router answers 503 until its discovery has admitted both pods.
        return answer if code == 200 else None

    answer = pair.cluster.wait_until("the stock sglang-router to route", routed, timeout)
    assert isinstance(answer, dict), answer
    return answer


def test_kv_moves_straight_between_the_pods_and_through_the_stock_router(
    sglang_pd: EnginePair,
) -> None:
    prefill, decode = sglang_pd.ip("prefill"), sglang_pd.ip("decode")
    before = metric(prefill, XFERS)
    direct = pd_generate(prefill, decode, "hello world", 8)
    assert direct["meta_info"]["completion_tokens"] == 8
    routed = _router_generate(sglang_pd, "hello world", 8)
    # Same prompt, greedy, same weights: the routed answer is the direct one.
    assert routed["text"] == direct["text"]
    assert metric(prefill, XFERS) >= before + 2


def _published(pair: EnginePair) -> None:
    """Until both pods show their scheduler gauges: SGLang's /metrics carries them only once the
    scheduler published them (observed: a decode's appeared seconds after its first batches)."""

    def shown() -> bool:
        return all(
            any(k.startswith("sglang:num_running_reqs{")
                for k in scrape(url(pair.ip(role), "/metrics")))
            for role in ("prefill", "decode")
        )  # fmt: skip

    pair.cluster.wait_until("both pods' scheduler gauges on /metrics", shown, 120)


def test_the_series_pdwarden_reads_exist_and_nothing_was_found(sglang_pd: EnginePair) -> None:
    _published(sglang_pd)
    prefill, decode = sglang_pd.ip("prefill"), sglang_pd.ip("decode")
    names = METRICS.names()
    # Gauges every PD server exports (the failure counters appear only after a failure).
    for ip, role in ((prefill, "prefill"), (decode, "decode")):
        for name in (
            "sglang:num_prefill_bootstrap_queue_reqs",
            "sglang:num_prefill_inflight_queue_reqs",
            "sglang:num_decode_prealloc_queue_reqs",
            "sglang:num_decode_transfer_queue_reqs",
            "sglang:num_running_reqs",
        ):
            assert name in names
            metric(ip, name, engine_type=role, tp_rank="0", pp_rank="0", moe_ep_rank="0")
    assert metric(prefill, XFERS, engine_type="prefill") >= 1
    sglang_pd.operator.wait_cycles(2)
    assert _quiet(sglang_pd) == ([], [], 0.0)


def test_a_pair_canary_moves_the_pairs_counters_by_exactly_what_pdwarden_subtracts(
    sglang_pd: EnginePair,
) -> None:
    """Canaries are traffic: detection subtracts what each one adds to a pod's counters
    (`engines.sglang.PAIR_CANARY.effects`: its KV request's one transfer on the prefill; the
    health checks move only series never read). Held here to the real pair: one canary sent with
    pdwarden's own sender, which must find the KV moved ("decoded"), every counter of both pods
    read before and after, in a quiet moment (retried when the operator's canary came between)."""
    targets = [
        Target(sglang_pd.pod(role)["metadata"]["name"], "uid", role, sglang_pd.ip(role),
               HTTP_PORT, engine="sglang",
               bootstrap_port=BOOTSTRAP_PORT if role == "prefill" else 0)
        for role in ("prefill", "decode")
    ]  # fmt: skip

    def landed(before: list[dict[str, float]], after: list[dict[str, float]]) -> bool:
        # The prefill's scheduler observes the transfer a moment after the decode answered.
        return after[0].get("kv_transfers") != before[0].get("kv_transfers")

    res, deltas = canary_effects.measured(
        targets, PAIR_CANARY, 30,
        lambda: sglang_pd.operator.metric("pdwarden_pair_canaries_total"), landed,
    )  # fmt: skip
    assert res.outcome == "decoded", res
    print(f"\n[sglang] one pair canary ({res.detail}) moved: {deltas}", flush=True)
    assert deltas, "every try had an operator canary in between"
    for role in ("prefill", "decode"):
        assert deltas[role] == PAIR_CANARY.effects.get(role, {}), role


def _families(text: str) -> dict[str, tuple[str, str, frozenset[frozenset[str]]]]:
    """Family -> (TYPE, HELP, the label-name sets of its samples)."""
    return {
        f.name: (f.type, f.documentation,
                 frozenset(frozenset(s.labels) for s in f.samples))
        for f in text_string_to_metric_families(text)
    }  # fmt: skip


def _simulated(role: str) -> str:
    """The simulator's /metrics with the real pair's flags, after the same kind of traffic."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SIM), "--model-path", "tiny", "--disaggregation-mode", role,
         "--host", "127.0.0.1", "--port", str(port), "--enable-metrics"],
        env={"PATH": "/usr/bin:/bin", "SGLANG_SIM_PHASE": "healthy"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http("GET", url + "/ready", timeout=2)[0] == 200, 30, "the simulator")
        for _ in range(3):
            http("GET", url + "/health", timeout=5)
        return str(http("GET", url + "/metrics", timeout=5)[1])
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_simulator_exposes_what_the_real_server_does(sglang_pd: EnginePair) -> None:
    """The simulator (servers this box cannot run) held to the real thing: every family it
    writes exists on the real server with the same TYPE, HELP and label names, and every series
    pdwarden reads that the real server writes, the simulator writes too."""
    _published(sglang_pd)
    read = {n.removesuffix("_count") for n in METRICS.names()}
    for role in ("prefill", "decode"):
        real = _families(str(http("GET", url(sglang_pd.ip(role), "/metrics"))[1]))
        sim = _families(_simulated(role))
        assert set(sim) <= set(real), f"{role}: not on the real server: {set(sim) - set(real)}"
        differ = {n: (sim[n], real[n]) for n in sim if sim[n] != real[n]}
        assert not differ, f"{role}: the simulator differs from the real server: {differ}"
        missing = {n for n in read & set(real) if n not in sim}
        assert not missing, f"{role}: pdwarden reads these, the simulator lacks them: {missing}"


def _events(pair: EnginePair, selector: str) -> list[dict[str, Any]]:
    answer = pair.cluster.kubectl(
        "get", "events", "-n", pair.namespace, "--field-selector", selector, "-o", "json"
    )  # fmt: skip
    return list(json.loads(answer.stdout)["items"])


def _wedge_events(pair: EnginePair) -> list[str]:
    return [str(e["message"]) for e in _events(pair, "reason=WedgeDetected")]


def _history(pair: EnginePair) -> list[dict[str, Any]]:
    return history(pair.cluster, pair.namespace, pair.name)


def _quiet(pair: EnginePair) -> tuple[list[str], list[dict[str, Any]], float]:
    """(pdwarden's Warning Events, ledger entries, findings counted): all empty on a healthy
    pair."""
    found = pair.operator.metric("pdwarden_wedges_detected_total")
    return pdwarden_warnings(pair.cluster, pair.namespace), _history(pair), found


class _Clients:
    """CLIENTS loops through the stock router until stopped; CANCEL_EVERY-th request of each
    loop hangs up: before the answer began (a read timeout shorter than a request), or
    mid-stream (a streamed answer closed after its first event)."""

    def __init__(self, router: str, loops: int, cancel_every: int = 3) -> None:
        self.router, self.cancel_every = router, cancel_every
        self.answered = self.cancelled = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(loops)
        ]

    def start(self) -> _Clients:
        for t in self._threads:
            t.start()
        return self

    def _loop(self, loop: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            text = f"client {loop} request {n}: " + "words " * random.randrange(4, 60)
            tokens = random.randrange(4, 32)
            try:
                if n % self.cancel_every == 0:
                    self._cancel(text, tokens, mid_stream=n % (2 * self.cancel_every) == 0)
                    self.cancelled += 1
                else:
                    code, answer = http(
                        "POST", self.router + "/generate", _body(text, tokens), timeout=120
                    )
                    if code == 200:
                        self.answered += 1
                    else:
                        self.failed += 1
                        self.errors.append(f"{code}: {answer!r:.300}")
            except OSError as exc:
                self.failed += 1
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def _cancel(self, text: str, tokens: int, *, mid_stream: bool) -> None:
        host, port = self.router.removeprefix("http://").rsplit(":", 1)
        conn = HTTPConnection(host, int(port), timeout=60)
        try:
            body = {**_body(text, tokens), "stream": mid_stream}
            conn.request("POST", "/generate", json.dumps(body),
                         {"Content-Type": "application/json"})  # fmt: skip
            if mid_stream:
                resp = conn.getresponse()
                resp.fp.readline()  # the first event, then hang up
            else:
                assert conn.sock is not None
                conn.sock.settimeout(random.uniform(0.01, 0.2))
                with contextlib.suppress(TimeoutError):
                    conn.getresponse()
        finally:
            conn.close()

    def stop(self) -> _Clients:
        self._stop.set()
        for t in self._threads:
            t.join(180)
        return self


def _body(text: str, tokens: int) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                              "ignore_eos": True}}  # fmt: skip


QUEUES = (
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)


def _queued(pair: EnginePair) -> dict[str, float]:
    out = {}
    for role in ("prefill", "decode"):
        ip = pair.ip(role)
        for name in QUEUES:
            out[f"{role} {name}"] = metric(ip, name, engine_type=role)
    return {k: v for k, v in out.items() if v}


def _answered(router: str, n: int) -> None:
    """One request of the storm's shape, answered whole (AssertionError otherwise)."""
    rng = random.Random(n)
    text = f"capacity request {n}: " + "words " * rng.randrange(4, 60)
    code, answer = http("POST", router + "/generate", _body(text, rng.randrange(4, 32)),
                        timeout=120)  # fmt: skip
    assert code == 200, f"{code}: {answer!r:.300}"


@pytest.mark.skipif(not CAPACITY_SECONDS, reason="opt-in: PDWARDEN_SGLANG_CAPACITY_SECONDS")
@pytest.mark.timeout(len(CAPACITY_LOOPS) * (CAPACITY_SECONDS + 300))
def test_the_storms_client_loops_reach_nine_tenths_of_the_pairs_capacity(
    sglang_pd: EnginePair,
) -> None:
    """The storm below claims a saturating load: its LOAD_LOOPS closed loops, never cancelling,
    answer at least 90 % of what the most loops measured get through the pair."""
    points = capacity.curve(
        lambda n: _answered(sglang_pd.router, n), CAPACITY_LOOPS, CAPACITY_SECONDS
    )
    share = capacity.share_reached(points, LOAD_LOOPS)
    print(f"\n[sglang] capacity through the router: {capacity.describe(points)}; "
          f"{LOAD_LOOPS} loops reach {share:.0%} of the peak")  # fmt: skip
    assert share >= 0.9


@pytest.mark.timeout(LOAD_SECONDS + 300)
def test_a_healthy_load_with_clients_hanging_up_draws_nothing_and_leaves_no_queue(
    sglang_pd: EnginePair,
) -> None:
    """The seeds' abort race on the real engine: clients through the stock router, a third of
    them hanging up before the answer or mid-stream, for LOAD_SECONDS at pdwarden's defaults."""
    events0, history0, found0 = _quiet(sglang_pd)
    clients = _Clients(sglang_pd.router, LOAD_LOOPS).start()
    start = time.monotonic()
    while time.monotonic() - start < LOAD_SECONDS:
        time.sleep(5)
    clients.stop()
    print(f"\n[sglang] {LOAD_SECONDS:.0f}s of {LOAD_LOOPS} clients: {clients.answered} answered "
          f"({clients.answered / LOAD_SECONDS:.1f}/s), {clients.cancelled} hung up, "
          f"{clients.failed} failed {clients.errors[:3]}")  # fmt: skip
    assert clients.answered > 0
    assert clients.cancelled >= 0.3 * (clients.answered + clients.cancelled) - LOAD_LOOPS
    assert not clients.failed, clients.errors[:5]
    # Every queue empties once the clients are gone (a room a hang-up left behind would stay).
    t0 = time.monotonic()
    left = sglang_pd.cluster.wait_until(
        "every queue gauge back to 0", lambda: not _queued(sglang_pd) or None, timeout=60
    )
    assert left
    print(f"[sglang] queues empty {time.monotonic() - t0:.0f}s after the storm")
    sglang_pd.operator.wait_cycles(2)
    assert _quiet(sglang_pd) == (events0, history0, found0)


def _timeline(pair: EnginePair, until: Any, timeout: float) -> tuple[list[str], float]:
    """Poll status until `until(history)` holds; every change of findings or ledger, timed."""
    seen: list[str] = []
    start = time.monotonic()
    while True:
        st = status(pair.cluster, pair.namespace, pair.name)
        entries = list((st.get("remediation") or {}).get("history", []))
        now = (
            f"wedges {[(w['pod'].rsplit('-', 2)[-2], w['reason']) for w in st.get('wedges', [])]} "
            f"ledger {[(e['action'], e.get('pod', '')) for e in entries]}"
        )
        if not seen or not seen[-1].endswith(now):
            seen.append(f"{time.monotonic() - start:5.0f}s {now}")
        if until(entries):
            return seen, time.monotonic() - start
        assert time.monotonic() - start < timeout, "\n".join(seen)
        time.sleep(2)


def _announced_on(pair: EnginePair, pod: str) -> list[str]:
    return [m for m in _wedge_events(pair) if f" on {pod}" in m.split(":", 1)[0]]


def _serving_again(pair: EnginePair, since: float) -> tuple[float, float]:
    """Seconds from `since` until both pods are Ready, and until the stock router answers (its
    own health checks readmit a new pod): the second minus the first is the router's part."""
    wait_ready(pair.cluster, pair.namespace, {"prefill": "1/1", "decode": "1/1"},
               STARTUP_SECONDS, pair.name)  # fmt: skip
    ready = time.monotonic() - since
    _router_generate(pair, "serving again", 4, timeout=300)
    return ready, time.monotonic() - since


def test_a_frozen_prefill_scheduler_is_found_on_the_prefill_and_restarted(
    sglang_pd: EnginePair,
) -> None:
    """The prefill's scheduler frozen with requests arriving through the router: every scheduler
    gauge of both pods stays at its last snapshot (the decode's showing requests running). The
    pair canary asks both sides' own /health: the prefill's gets no answer twice in a row while
    the decode's does, so the prefill is restarted (RestartPrefill: an abort would go through
    the frozen scheduler) and nothing is found on the decode."""
    prefill = sglang_pd.pod("prefill")
    name, uid = prefill["metadata"]["name"], prefill["metadata"]["uid"]
    decode = sglang_pd.pod("decode")["metadata"]["name"]
    clients = _Clients(sglang_pd.router, 2, cancel_every=10**9).start()
    frozen = freeze_scheduler(uid)
    frozen_at = time.monotonic()
    try:
        seen, took = _timeline(sglang_pd, lambda h: h, timeout=WEDGE_AFTER + 240)
    finally:
        thaw(frozen)
        clients.stop()
    print("\n[sglang] frozen prefill:\n  " + "\n  ".join(seen))
    [entry] = _history(sglang_pd)
    assert (entry["action"], entry["pod"], entry["uid"]) == ("RestartPrefill", name, uid), entry
    assert entry["reason"].startswith("PrefillDead: pair canary"), entry
    assert not _announced_on(sglang_pd, decode), _wedge_events(sglang_pd)
    ready, serving = _serving_again(sglang_pd, frozen_at)
    assert sglang_pd.pod("prefill")["metadata"]["uid"] != uid
    record("sglang", "frozen prefill scheduler, requests arriving", action="RestartPrefill",
           action_seconds=took, serving_seconds=serving)  # fmt: skip
    print(f"[sglang] frozen prefill -> RestartPrefill {took:.0f}s after the freeze; both pods "
          f"Ready {ready:.0f}s and serving through the router {serving:.0f}s after it (the "
          f"router's readmission: {serving - ready:.0f}s)")  # fmt: skip
    assert not _announced_on(sglang_pd, decode), _wedge_events(sglang_pd)
    assert len(_history(sglang_pd)) == 1


def test_a_frozen_decode_scheduler_is_cordoned_restarted_and_readmitted_by_the_router(
    sglang_pd: EnginePair,
) -> None:
    """The decode's scheduler frozen with requests in its queues: the pair canary hears the
    prefill's /health and not the decode's, twice in a row, so the decode is dead: cordoned
    (although it is the only one: it serves nobody), restarted restartAfterSeconds later, and
    the stock router routes to the new pod once its own health checks readmit it. Nothing is
    found on the prefill while the decode is dead (its rooms wait on that decode); once the
    decode is gone, rooms it stranded on the prefill may be aborted (AbortRequests), never the
    prefill restarted."""
    prefill = sglang_pd.pod("prefill")["metadata"]["name"]
    decode = sglang_pd.pod("decode")
    name, uid = decode["metadata"]["name"], decode["metadata"]["uid"]
    before, events = len(_history(sglang_pd)), set(_announced_on(sglang_pd, prefill))
    clients = _Clients(sglang_pd.router, 2, cancel_every=10**9).start()
    frozen = freeze_scheduler(uid)
    frozen_at = time.monotonic()
    try:
        seen, cordoned = _timeline(sglang_pd, lambda h: len(h) > before, WEDGE_AFTER + 240)
        assert set(_announced_on(sglang_pd, prefill)) == events, _wedge_events(sglang_pd)
        more, restarted = _timeline(
            sglang_pd, lambda h: any(e["action"] == "RestartDecode" for e in h[before:]),
            RESTART_AFTER + 240,
        )  # fmt: skip
    finally:
        thaw(frozen)
        clients.stop()
    print("\n[sglang] frozen decode:\n  " + "\n  ".join(seen + more))
    cordon, restart = (e for e in _history(sglang_pd)[before:] if e["pod"] == name)
    assert (cordon["action"], cordon["pod"], cordon["uid"]) == ("CordonDecode", name, uid)
    assert "engine frozen" in cordon["reason"], cordon
    assert (restart["action"], restart["pod"], restart["uid"]) == ("RestartDecode", name, uid)
    ready, serving = _serving_again(sglang_pd, frozen_at)
    assert sglang_pd.pod("decode")["metadata"]["uid"] != uid
    record("sglang", "frozen decode scheduler, requests arriving", action="CordonDecode",
           action_seconds=cordoned, restart_seconds=cordoned + restarted,
           serving_seconds=serving)  # fmt: skip
    print(f"[sglang] frozen decode -> CordonDecode {cordoned:.0f}s, RestartDecode "
          f"{cordoned + restarted:.0f}s after the freeze; both pods Ready {ready:.0f}s and "
          f"serving through the router {serving:.0f}s after it (the router's readmission: "
          f"{serving - ready:.0f}s)")  # fmt: skip
    on_prefill = [e for e in _history(sglang_pd)[before:] if e["pod"] == prefill]
    assert all(e["action"] == "AbortRequests" for e in on_prefill), on_prefill
    assert all(e["time"] >= restart["time"] for e in on_prefill), on_prefill
    print(f"[sglang] on the prefill after the decode's restart: "
          f"{[(e['action'], e['reason'][:120]) for e in on_prefill]}")  # fmt: skip


def test_a_killed_decode_is_left_to_the_kubelet_and_nothing_harms_the_prefill(
    sglang_pd: EnginePair,
) -> None:
    """Every process of the decode killed (an OOM kill) under load, the prefill alive: the
    kubelet restarts the container, SGLang's prefill counts the failed transfers and bootstraps
    itself, and pdwarden restarts nothing (the decode's metrics are gone: unknown, never
    judged); the rooms the dead decode stranded on the prefill may be aborted (AbortRequests),
    the prefill is never restarted. The pair serves again."""
    prefill = sglang_pd.pod("prefill")
    prefill_name, prefill_uid = prefill["metadata"]["name"], prefill["metadata"]["uid"]
    decode = sglang_pd.pod("decode")
    before, told = len(_history(sglang_pd)), set(_wedge_events(sglang_pd))
    clients = _Clients(sglang_pd.router, 2, cancel_every=10**9).start()
    killed_at = time.monotonic()
    try:
        kill_server(decode["metadata"]["uid"])
        ready, serving = _serving_again(sglang_pd, killed_at)
    finally:
        clients.stop()
    sglang_pd.operator.wait_cycles(2)
    after = _history(sglang_pd)[before:]
    prefill_ip = sglang_pd.ip("prefill")
    failed = {
        name: sum(
            v for k, v in scrape(url(prefill_ip, "/metrics")).items()
            if k.partition("{")[0] == name
        )
        for name in ("sglang:num_bootstrap_failed_reqs_total",
                     "sglang:num_transfer_failed_reqs_total")
    }  # fmt: skip
    print(f"\n[sglang] killed decode: both pods Ready {ready:.0f}s and serving through the "
          f"router {serving:.0f}s after the kill; SGLang's prefill counted {failed}; pdwarden: "
          f"{[(e['action'], e['pod'], e['reason'][:100]) for e in after]}")  # fmt: skip
    record("sglang", "decode killed (every process)", action=None, action_seconds=None,
           serving_seconds=serving)  # fmt: skip
    assert sglang_pd.pod("prefill")["metadata"]["uid"] == prefill_uid  # never restarted
    assert all(e["action"] == "AbortRequests" and e["pod"] == prefill_name for e in after), after
    # The failures it counted were the decode's absence, not a broken path: no suspicion.
    new = [m for m in _wedge_events(sglang_pd) if m not in told]
    assert not [m for m in new if m.startswith("TransfersFailing")], new
