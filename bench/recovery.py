"""Time to recovery from wedges: pdwarden's remediation cycle vs. the engines' own timeouts.

How, without Kubernetes: real pdworker processes on 127.0.0.1 with their fault switches, and the
operator's own remediation core run in-process at the configured interval:
`pdwarden.remediation.scrape.worker_client` (`WorkerClient.scrape`, `fail_rooms`) ->
`pdwarden.remediation.detect.rules.detect` -> `pdwarden.remediation.decide.plan`
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

import time
from pathlib import Path
from typing import Any

from bench import common
from bench._recovery_false_positives import long_prefill, long_prefill_sglang
from bench._recovery_loop import remediation_spec
from bench._recovery_wedges import abort_race, stalled_decode

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


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    started = time.monotonic()
    settings = QUICK_SETTINGS if quick else SETTINGS
    scenarios: dict[str, dict[str, Any]] = {}
    for label, s in settings.items():
        scenarios[label] = {
            "settings": remediation_spec(s).model_dump(by_alias=True),
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
