"""Detection for engines whose decode pulls KV (vLLM 0.32's NixlConnector): detect/pull.py.

The wedged series follow what real vLLM servers showed when their engine processes were
SIGSTOPped (tests/remediation/data/vllm_*.prom); the loaded series is a recording of a real
pair under six client loops on an overloaded machine (data/vllm_healthy_load.json, made by
record_vllm_samples.py), replayed scrape by scrape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import detect
from pdwarden.values import Sample

DATA = Path(__file__).parent / "data"
WINDOW = 10.0


def series(n: int, step: float = 1.0, **fields: Any) -> tuple[Sample, ...]:
    """n samples one `step` apart; a callable field gets the sample index."""
    return tuple(
        Sample(at=i * step, **{k: (v(i) if callable(v) else v) for k, v in fields.items()})
        for i in range(n)
    )


def decode(name: str = "decode-0", **fields: Any) -> PodView:
    base = {
        "running": 0.0,
        "waiting_queue": 0.0,
        "transfer_queue": 0.0,
        "reading_queue": 0.0,
        "generated_tokens": 100.0,
        "kv_transfers": 10.0,
        "failed": 0.0,
        "completed": 5.0,
    }
    return PodView(name, "decode", name + "-uid", history=series(15, **{**base, **fields}))


def prefill(name: str = "prefill-0", **fields: Any) -> PodView:
    base = {
        "running": 0.0,
        "waiting_queue": 0.0,
        "prefill_tokens": 500.0,
        "kv_expired": 0.0,
        "late_notifications": 0.0,
        "completed": 20.0,
        "failed": 0.0,
    }
    return PodView(name, "prefill", name + "-uid", history=series(15, **{**base, **fields}))


def reasons(pods: list[PodView]) -> list[tuple[str, str]]:
    return sorted((f.reason, f.pod) for f in detect(pods, WINDOW).findings)


def test_a_read_stuck_on_a_frozen_prefill_names_the_prefill_and_is_not_a_decode_stall() -> None:
    """Measured: decode in_progress 1, transfers flat, waiting 1, running 0; prefill flat."""
    pods = [decode(reading_queue=1.0, waiting_queue=1.0), prefill()]
    det = detect(pods, WINDOW)
    (f,) = det.findings
    assert (f.reason, f.pod, f.peer, f.suspects) == ("KVReadStuck", "decode-0", "prefill-0",
                                                      ("prefill-0",))  # fmt: skip
    assert "none finished or failed" in f.evidence
    assert "decode-0" not in det.stalled_decodes and "decode-0" not in det.healthy_decodes


def test_a_prefill_proven_alive_is_no_suspect() -> None:
    busy = prefill("prefill-1", prefill_tokens=lambda i: 500.0 + 40 * i)
    (f,) = detect([decode(reading_queue=1.0), prefill(), busy], WINDOW).findings
    assert f.suspects == ("prefill-0",) and f.peer == "prefill-0"
    (g,) = detect([decode(reading_queue=1.0), prefill(), prefill("prefill-2")], WINDOW).findings
    assert g.suspects == ("prefill-0", "prefill-2") and g.peer is None  # a canary must decide


@pytest.mark.parametrize(
    "moving",
    [{"kv_transfers": lambda i: 10.0 + i}, {"failed": lambda i: float(i >= 7)}],
    ids=["reads-finish", "a-read-failed"],
)
def test_reads_that_finish_or_fail_are_not_stuck(moving: dict[str, Any]) -> None:
    assert reasons([decode(reading_queue=1.0, **moving), prefill()]) == []


def test_a_read_in_flight_for_part_of_the_window_is_not_stuck() -> None:
    blip = decode(reading_queue=lambda i: 1.0 if i > 8 else 0.0)
    assert reasons([blip, prefill()]) == []


def test_engines_without_a_reading_gauge_never_get_this_finding() -> None:
    """pdworker and SGLang decodes report no reading_queue (the prefill pushes)."""
    pods = [PodView("d", "decode", "u", history=series(15, transfer_queue=0.0, running=0.0,
                                                       kv_transfers=3.0, generated_tokens=9.0)),
            prefill()]  # fmt: skip
    assert reasons(pods) == []


def test_an_expired_lease_suspects_the_decodes_that_made_no_progress() -> None:
    """Measured: decode engine frozen behind its API server shows nothing; the prefill counts
    nixl_num_kv_expired_reqs once the 30 s lease ran out."""
    frozen = decode("decode-0")
    busy = decode("decode-1", generated_tokens=lambda i: 100.0 + 8 * i, running=2.0)
    p = prefill(kv_expired=lambda i: 0.0 if i < 12 else 1.0)
    findings = detect([frozen, busy, p], WINDOW).findings
    (f,) = [f for f in findings if f.reason == "LeaseExpired"]
    assert (f.pod, f.suspects, f.peer, f.room_count) == ("prefill-0", ("decode-0",), "decode-0", 0)
    assert "1 requests' KV freed unread" in f.evidence


def _late(at: int) -> Any:
    return lambda i: 0.0 if i < at else 1.0


def test_late_notifications_after_an_expired_lease_are_reported_and_alone_they_are_not() -> None:
    """The corruption shape (measured with a frozen decode): the lease expires, then the thawed
    decode reads the freed blocks. The same late notification with no expired lease is what a
    client abort makes on vLLM 0.32 (pull_worker.py:656-667 counts any notification about a
    request the prefill no longer tracks)."""
    after = prefill(kv_expired=_late(10), late_notifications=_late(14))
    assert ("LateNotification", "prefill-0") in reasons([decode(), after])
    alone = prefill(late_notifications=_late(14))
    assert reasons([decode(), alone]) == []
    old = prefill(kv_expired=1.0, late_notifications=1.0)  # rose before the window: reported
    assert reasons([decode(), old]) == []
    # A decode frozen past its lease reads after thawing: the expiry may precede the window.
    thawed = PodView("prefill-0", "prefill", "p", history=series(
        40, prefill_tokens=500.0, kv_expired=_late(5), late_notifications=_late(38)))  # fmt: skip
    assert [r for r, _ in reasons([decode(), thawed])] == ["LateNotification"]


def test_late_notifications_from_client_aborts_draw_no_finding() -> None:
    """A storm of client aborts on the real pair: late notifications climbing, not one lease
    expired, the decode busy. Nothing was corrupted; nothing is reported."""
    busy = decode(generated_tokens=lambda i: 100.0 + 8 * i, running=2.0)
    aborts = prefill(late_notifications=lambda i: float(3 * i),
                     prefill_tokens=lambda i: 500.0 + 40 * i)  # fmt: skip
    assert detect([busy, aborts], WINDOW).findings == ()


def test_an_expiry_that_came_after_the_late_notifications_does_not_explain_them() -> None:
    shape = prefill(late_notifications=_late(8), kv_expired=_late(12))
    assert [r for r, _ in reasons([decode(), shape])] == ["LeaseExpired"]


def _recorded(role: str) -> tuple[Sample, ...]:
    data = json.loads((DATA / "vllm_healthy_load.json").read_text())
    return tuple(Sample(**row) for row in data[role])


def _replay(window: float) -> dict[str, list[float]]:
    """Each rule that fired while the real recording is replayed scrape by scrape: when."""
    pods = [PodView("prefill-0", "prefill", "p", history=_recorded("prefill")),
            PodView("decode-0", "decode", "d", history=_recorded("decode"))]  # fmt: skip
    fired: dict[str, list[float]] = {}
    for end in range(2, len(pods[1].history) + 1):
        cut = [PodView(p.name, p.role, p.uid, history=p.history[:end]) for p in pods]
        for f in detect(cut, window).findings:
            fired.setdefault(f.reason, []).append(cut[0].history[-1].at)
    return fired


@pytest.mark.parametrize("window", [30.0, 45.0, 60.0])
def test_a_real_pair_under_overload_is_judged_only_by_what_vllm_itself_reported(
    window: float,
) -> None:
    """The recording: six client loops for 150 s on two cores shared with other work (load
    10-24). The decode's generation stopped for up to ~30 s at a time with requests running, a
    read took up to 21 s, and vLLM itself let two KV leases expire and then served those blocks
    (its log: "Potentially invalid KV blocks ... retrieved by a decode worker"). With a window
    of e2e's 45 s or the default 60 s no stall and no stuck read is found; the two lease rules
    fire, from the scrape where the prefill's own counters rose, and only then."""
    fired = _replay(window)
    assert set(fired) == {"LeaseExpired", "LateNotification"}
    rises = [s.at for a, s in zip(_recorded("prefill"), _recorded("prefill")[1:], strict=False)
             if (s.kv_expired or 0) > (a.kv_expired or 0)]  # fmt: skip
    assert min(fired["LeaseExpired"]) == rises[0]
    assert fired["LeaseExpired"] == fired["LateNotification"]  # each expiry was read later on


# -- PromptsRecomputed: the decode computes its prompts itself, and no KV arrives --------------


def recomputing(**fields: Any) -> PodView:
    """A decode under load whose every prompt is computed locally (16 tokens a scrape): what
    kv_load_failure_policy recompute makes of reads that fail, as the client sees nothing."""
    base: dict[str, Any] = {
        "generated_tokens": lambda i: 100.0 + 8 * i, "running": 2.0,
        "prefill_tokens": lambda i: 200.0 + 16 * i, "recomputed_tokens": lambda i: 16.0 * i,
        "transferred_tokens": 200.0, "failed": float,
    }  # fmt: skip
    return decode(**{**base, **fields})


def test_a_decode_that_recomputes_every_prompt_is_reported_and_not_healthy() -> None:
    det = detect([recomputing(), prefill(prefill_tokens=lambda i: 500.0 + 16 * i)], WINDOW)
    (f,) = det.findings
    assert (f.reason, f.pod, f.role, f.suspects) == ("PromptsRecomputed", "decode-0", "decode", ())
    assert f.evidence.startswith("160 prompt tokens computed on this decode and none arrived")
    assert "(10 KV reads failed)" in f.evidence
    assert "decode-0" not in det.healthy_decodes and "decode-0" not in det.stalled_decodes


@pytest.mark.parametrize(
    "fields",
    [
        {"transferred_tokens": lambda i: 200.0 + 16 * max(i - 10, 0)},  # transfers came back
        {"recomputed_tokens": float, "failed": 0.0},  # prefix-cache hits: 1 of 16
        {"recomputed_tokens": 0.0, "failed": 0.0},  # idle
        {"recomputed_tokens": None, "transferred_tokens": None},  # pdworker, SGLang: no series
    ],
    ids=["transfers-resumed", "own-prefix-cache", "idle", "not-reported"],
)
def test_a_decode_whose_kv_arrives_or_that_computes_little_is_not_reported(
    fields: dict[str, Any],
) -> None:
    assert reasons([recomputing(**fields), prefill()]) == []


def test_a_recomputing_decode_plus_canaries_that_transferred_is_still_recomputing() -> None:
    """Canaries are traffic: a pair canary's KV that arrived (one read, its 32 prompt tokens) is
    subtracted before any rule reads the decode, so it cannot hide that users' prompts do not."""
    from pdwarden.engines.vllm import PAIR_CANARY
    from pdwarden.remediation.memory import organic

    raw = recomputing(
        transferred_tokens=lambda i: 200.0 + 32 * (i >= 6) + 32 * (i >= 11),
        prefill_tokens=lambda i: 200.0 + 16 * i + 32 * (i >= 6) + 32 * (i >= 11),
    )
    assert reasons([raw, prefill()]) == []  # read raw, the canaries' transfers look like PD works
    effect = PAIR_CANARY.effects["decode"]
    canaries = [(6.0, effect), (11.0, effect)]
    seen = PodView(raw.name, raw.role, raw.uid, history=organic(raw.history, canaries))
    assert reasons([seen, prefill()]) == [("PromptsRecomputed", "decode-0")]


def test_a_few_transfers_in_the_window_do_not_hide_a_decode_that_recomputes_the_rest() -> None:
    """Measured on the real pair: requests sent straight to the decode for minutes, while a pair
    canary's 32 tokens arrived every 10-15 s and some were not taken off as canary traffic."""
    few = recomputing(transferred_tokens=lambda i: 200.0 + 16 * (i >= 13))
    (f,) = detect([few, prefill()], WINDOW).findings
    assert f.reason == "PromptsRecomputed"
    assert f.evidence.startswith("160 prompt tokens computed on this decode and only 16 arrived")


def test_the_one_read_a_dead_prefill_failed_is_not_reported() -> None:
    """RestartPrefill kills the prefill a read is stuck on: the decode recomputes that one
    request (kv_load_failure_policy recompute), and no other comes until a prefill serves."""
    once = recomputing(
        recomputed_tokens=lambda i: 48.0 * (i >= 8), failed=lambda i: float(i >= 8),
        prefill_tokens=lambda i: 200.0 + 48 * (i >= 8),
    )  # fmt: skip
    assert reasons([once, prefill()]) == []
