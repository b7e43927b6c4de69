"""Wedge rules for engines whose decode PULLS the KV from a prefill (vLLM's NixlConnector).

Why separate from rules.py: with pdworker and SGLang the prefill pushes KV and its inflight
queue shows a wedge; with vLLM 0.32 the decode posts a NIXL READ and the prefill only holds the
blocks under a lease, so the evidence sits elsewhere and no metric names the peer. Each rule
below cites the vLLM source that makes its signal trustworthy. Checked on real vLLM servers
(tests/remediation/data/vllm_*.prom and the healthy-load series recorded beside them).

* KVReadStuck (decode): reads the decode posted stayed in flight (`reading_queue`, vLLM
  `num_requests_kv_fetch_by_stage{stage="in_progress"}`) in every sample of the window while
  not one read finished or failed (`kv_transfers` = `nixl_xfer_time_seconds_count`, observed per
  finished read, nixl/base_worker.py:3086; `failed` = nixl failure counters). vLLM has no deadline
  on such a read (base_worker.py:3064 `_pop_done_transfers` waits for NIXL forever); under healthy
  load reads finish within milliseconds, so the counter moves whenever the gauge is non-zero.
  The decode's own metrics cannot tell a frozen prefill from a decode frozen mid-read (its
  gauges freeze in both; no engine series moves while it waits: measured), so the finding names
  SUSPECTS: every prefill pod whose per-step prompt-token counter did not move in the window (a
  live engine under load moves it every step, loggers.py:1262; a frozen one cannot). The repair
  confirms with a canary before restarting anyone.
* LeaseExpired (prefill): blocks a prefill held for a decode were freed because no decode read
  them within `kv_lease_duration` (30 s default, nixl/base_scheduler.py:82; counted at
  nixl/pull_worker.py:158). A decode frozen behind its live API server shows nothing on its own
  metrics (requests never reach its scheduler: measured running = waiting = 0), so this is the
  only trace. A client that aborts between the two legs expires a lease too, so the finding is
  a suspicion: SUSPECTS are the decode pods whose per-step token counter did not move in the
  window, for a canary to confirm. It is not only reported: the cycle asks each suspect for
  one token (remediation.confirm.canary). A frozen engine's API server still answers /health
  200 (AsyncLLM.check_health, v1/engine/async_llm.py:1089, fails only once the engine core
  died) and GET /v1/models (served from its configuration, entrypoints/openai/models/
  serving.py:64), but the one-token completion never comes; a decode so confirmed dead gets
  CordonDecode, then RestartDecode while it stays dead (decide/rungs.py, rung 2v).
* LateNotification (prefill): a decode finished reading blocks the prefill had already freed
  because their lease expired: the decode may have served KV the prefill reused. vLLM's
  counter (nixl/pull_worker.py:656-667 `record_notification_after_expiry`) counts EVERY
  read-done notification about a request the prefill no longer tracks, and a client abort
  makes those too (the prefill logs "Potentially invalid KV blocks for unrecognized request";
  measured on the real pair: late notifications with not one lease expired). So the finding
  needs both: late notifications rose in the window AND the expired-lease counter rose no later
  than they did, within the window plus EXPIRY_LOOKBACK_S (bounded by the history held). Late
  notifications with no expired lease are the abort case: no finding, no Event. Nothing to
  repair any more; it is reported (Event, alert). vLLM counts it at the prefill's next step, so
  it can appear long after the read.
* PromptsRecomputed (decode): prefill/decode disaggregation is off for this decode while every
  client still gets an answer. With kv_load_failure_policy recompute a failed read is recomputed
  on the decode, and a router that sends requests without KV params lands there too. The rule:
  in the whole window the decode computed at least half of its prompt tokens itself
  (`recomputed_tokens`, vLLM `prompt_tokens_by_source{source="local_compute"}`, against
  `prefill_tokens`, `prompt_tokens_total`), the count rose at RECOMPUTED_SCRAPES scrapes or
  more, and at most TRANSFERRED_SHARE_MAX of its prompt tokens' KV arrived from a prefill
  (`transferred_tokens`, source `external_kv_transfer`). A healthy decode's prompts arrive whole
  by transfer (measured: 48 of 48 tokens external). Not "none at all": a few reads that are no
  user's (measured on the real pair with requests sent straight to the decode: the pair
  canaries' 32 tokens every 10-15 s, 128 of 9000 prompt tokens in a window, some not taken off
  as canary traffic) would hide a decode that recomputes everything else. The half keeps out
  prompts served from the decode's own prefix
  cache (`local_cache_hit`, a token or so computed); the repeated rises keep out the one read
  that failed when its prefill died (pdwarden's own RestartPrefill makes exactly that, and no
  other request comes until a prefill serves again). The failed-read count goes in the
  evidence. It is reported (Event, alert), never repaired: no metric says which side holds the
  stale state.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL
from pdwarden.remediation.detect.evidence import Finding, PodView, moved, window_of

# How far before the window an expired lease still explains a late notification: vLLM's
# default kv_lease_duration (nixl/base_scheduler.py:82). A decode frozen past its lease reads
# after thawing, so the expiry comes first; detection holds the window plus a few scrape
# intervals of history (remediation.cycle), which bounds this lookback in practice.
EXPIRY_LOOKBACK_S = 30.0
# Scrapes of the window at which a decode's locally computed prompt tokens rose, at least, for
# PromptsRecomputed: requests that keep coming and keep being recomputed, not one failed read.
RECOMPUTED_SCRAPES = 3
# The most of a decode's prompt tokens in the window whose KV may have arrived by transfer for
# PromptsRecomputed: a decode whose PD works gets nearly all of it that way.
TRANSFERRED_SHARE_MAX = 0.1


def _not_proven_alive(pods: Sequence[PodView], role: str, counter: str, since: float) -> list[str]:
    """Pods of `role` whose per-step `counter` did not move since `since` (or cannot say)."""
    out = []
    for p in pods:
        if p.role != role:
            continue
        recent = [s for s in p.history if s.at >= since]
        if p.stale or len(recent) < 2 or not moved(recent, counter):
            out.append(p.name)
    return sorted(out)


def kv_read_stuck(pod: PodView, pods: Sequence[PodView], window_seconds: float) -> Finding | None:
    window = window_of(pod.history, window_seconds)
    if window is None or any(s.reading_queue is None for s in window):
        return None
    if not all((s.reading_queue or 0) > 0 for s in window):
        return None
    if moved(window, "kv_transfers") or moved(window, "failed"):
        return None
    first, last = window[0], window[-1]
    suspects = _not_proven_alive(pods, ROLE_PREFILL, "prefill_tokens", first.at)
    peer = suspects[0] if len(suspects) == 1 else None
    return Finding(
        pod=pod.name, role=ROLE_DECODE, reason="KVReadStuck",
        room_count=int(min(s.reading_queue or 0 for s in window)),
        oldest_seconds=last.at - first.at, peer=peer, suspects=tuple(suspects),
        evidence=(
            f"{min(s.reading_queue or 0 for s in window):g} KV reads in flight for "
            f"{last.at - first.at:.0f}s and none finished or failed (transfers flat at "
            f"{last.kv_transfers or 0:g}); prefill pods not proven alive: "
            f"{', '.join(suspects) or 'none'}"
        ),
    )  # fmt: skip


def prompts_recomputed(pod: PodView, window_seconds: float) -> Finding | None:
    window = window_of(pod.history, window_seconds)
    if window is None or any(s.transferred_tokens is None for s in window):
        return None
    local = [s.recomputed_tokens for s in window]
    if any(v is None for v in local):
        return None
    first, last = window[0], window[-1]
    recomputed = (last.recomputed_tokens or 0) - (first.recomputed_tokens or 0)
    prompts = (last.prefill_tokens or 0) - (first.prefill_tokens or 0)
    rises = sum((b or 0) > (a or 0) for a, b in pairwise(local))
    if rises < RECOMPUTED_SCRAPES or recomputed < prompts / 2:
        return None
    transferred = (last.transferred_tokens or 0) - (first.transferred_tokens or 0)
    if transferred > TRANSFERRED_SHARE_MAX * prompts:
        return None
    arrived = "none" if transferred <= 0 else f"only {transferred:g}"
    failed = max((last.failed or 0) - (first.failed or 0), 0)
    return Finding(
        pod=pod.name, role=ROLE_DECODE, reason="PromptsRecomputed",
        oldest_seconds=last.at - first.at,
        evidence=(
            f"{recomputed:g} prompt tokens computed on this decode and {arrived} arrived by KV "
            f"transfer in the last {last.at - first.at:.0f}s ({failed:g} KV reads failed): "
            f"prefill/decode disaggregation is off for this decode while its clients still get "
            f"answers (kv_load_failure_policy recompute, or requests sent without KV params)"
        ),
    )  # fmt: skip


def _rose(pod: PodView, field: str, window_seconds: float) -> tuple[float, float] | None:
    """(risen by, now) when the counter rose inside the window; None otherwise."""
    recent = [s for s in pod.history if s.at >= pod.history[-1].at - window_seconds]
    values = [getattr(s, field) for s in recent if getattr(s, field) is not None]
    if len(values) < 2 or values[-1] <= values[0]:
        return None
    return values[-1] - values[0], values[-1]


def _rises_at(pod: PodView, field: str, since: float) -> list[float]:
    """When the counter rose (the sample that first showed each rise) since `since`."""
    pairs = [(s.at, getattr(s, field)) for s in pod.history if s.at >= since]
    known = [(at, v) for at, v in pairs if v is not None]
    return [at for (_, a), (at, b) in pairwise(known) if b > a]


def _late_after_expiry(pod: PodView, window_seconds: float) -> bool:
    """Late notifications rose in the window and a lease expired no later than they did."""
    now = pod.history[-1].at
    late = _rises_at(pod, "late_notifications", now - window_seconds)
    expired = _rises_at(pod, "kv_expired", now - window_seconds - EXPIRY_LOOKBACK_S)
    return bool(late and expired) and min(expired) <= max(late)


def prefill_lease_findings(
    pod: PodView, pods: Sequence[PodView], window_seconds: float
) -> list[Finding]:
    out: list[Finding] = []
    expired = _rose(pod, "kv_expired", window_seconds)
    if expired is not None:
        since = pod.history[-1].at - window_seconds
        suspects = _not_proven_alive(pods, ROLE_DECODE, "generated_tokens", since)
        out.append(
            Finding(
                # Not wedged rooms (vLLM already freed those blocks): the count is in evidence.
                pod=pod.name, role=ROLE_PREFILL, reason="LeaseExpired", suspects=tuple(suspects),
                peer=suspects[0] if len(suspects) == 1 else None,
                evidence=(
                    f"{expired[0]:g} requests' KV freed unread after their lease in the last "
                    f"{window_seconds:g}s ({expired[1]:g} in all); decode pods not proven "
                    f"alive: {', '.join(suspects) or 'none'}"
                ),
            )
        )  # fmt: skip
    late = _rose(pod, "late_notifications", window_seconds)
    if late is not None and _late_after_expiry(pod, window_seconds):
        out.append(
            Finding(
                pod=pod.name, role=ROLE_PREFILL, reason="LateNotification",
                evidence=(
                    f"{late[0]:g} decode reads finished after this prefill stopped tracking "
                    f"their request ({late[1]:g} in all), following an expired KV lease: a "
                    f"decode may have served KV this prefill had freed"
                ),
            )
        )  # fmt: skip
    return out


def pull_findings(pods: Sequence[PodView], window_seconds: float) -> list[Finding]:
    """Every pull-transfer finding over fresh pods (others are unknown, judged nowhere)."""
    out: list[Finding] = []
    for pod in pods:
        if pod.stale or pod.latest is None:
            continue
        if pod.role == ROLE_DECODE:
            stuck = kv_read_stuck(pod, pods, window_seconds)
            recomputing = prompts_recomputed(pod, window_seconds)
            out += [f for f in (stuck, recomputing) if f is not None]
        elif pod.role == ROLE_PREFILL:
            out += prefill_lease_findings(pod, pods, window_seconds)
    return out
