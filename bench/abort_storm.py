"""Abort storm: 30 concurrent clients, 30% of requests cancelled at random moments, fixed time.

Cancellations land before, during and after the KV transfer (uniform in 0-150 ms; one-page
chunks so a room spends time in transfer). Reported: throughput, outcomes, and what leaked
afterwards, which must be nothing: `GET /admin/rooms` empty on both workers (admin token), every
queue gauge 0, every KV page free, no checksum mismatch, no failure reason other than `aborted`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import common, harness
from pdworker import contract

FLAGS = [
    "--layers", "2", "--heads", "2", "--head-dim", "16", "--page-size", "4", "--vocab", "1024",
    "--kv-pages", "4096", "--chunk-pages", "1", "--device", "cpu",
]  # fmt: skip
REASONS = contract.FAILURE_REASONS


def leaks(w: harness.Workers, proc: harness.Proc) -> dict[str, Any]:
    s = harness.scrape(proc.url)
    status, rooms = w.admin(proc, "GET", contract.ADMIN_ROOMS_PATH)
    return {
        "rooms": len(rooms) if status == 200 and isinstance(rooms, list) else -1,
        "queue_gauges_sum": sum(harness.metric(s, q) for q in harness.QUEUES),
        "pages_in_use": harness.metric(s, contract.KV_PAGES_TOTAL)
        - harness.metric(s, contract.KV_PAGES_FREE),
        "checksum_mismatch": harness.metric(s, contract.KV_CHECKSUM_MISMATCH),
        "failed_by_reason": {
            r: harness.metric(s, contract.REQUESTS_FAILED, reason=r) for r in REASONS
        },
    }


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    duration = 4.0 if quick else 30.0
    started = time.monotonic()
    with harness.Workers() as w:
        prefill = w.worker("prefill", *FLAGS)
        decode = w.worker("decode", *FLAGS)
        router = w.router([prefill], [decode])
        w.wait_ready(prefill, decode, router)
        summary = w.load(
            router, "--clients", "30", "--duration", str(duration),
            "--cancel-fraction", "0.3", "--cancel-max-ms", "150", "--prompt-len", "4:64",
            "--output-len", "1:8", "--vocab", "1024", "--seed", "7",
        )  # fmt: skip
        t0 = time.monotonic()
        settled = True
        try:
            harness.wait_for(lambda: w.clean(prefill) and w.clean(decode), 30, "workers clean")
        except TimeoutError:
            settled = False
        clean_after = time.monotonic() - t0
        after = {"prefill": leaks(w, prefill), "decode": leaks(w, decode)}
    leaked_rooms = sum(max(0, a["rooms"]) for a in after.values())
    leaked_total = sum(
        a["rooms"] != 0 or a["queue_gauges_sum"] or a["pages_in_use"] for a in after.values()
    )
    unexpected = {
        f"{role}:{r}": v
        for role, a in after.items()
        for r, v in a["failed_by_reason"].items()
        if r != "aborted" and v
    }
    data = {
        "duration_s": duration,
        "clients": 30,
        "cancel_fraction": 0.3,
        "load": summary,
        "throughput_requests_per_s": summary["requests"] / summary["duration_s"],
        "completed_per_s": summary["completed"] / summary["duration_s"],
        "leaked_rooms": leaked_rooms,
        "leak_free": leaked_total == 0 and settled,
        "seconds_to_clean": round(clean_after, 3),
        "unexpected_failures": unexpected,
        "after": after,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    figures = (
        f"{duration:.0f} s, 30 clients, 30% cancelled: {data['throughput_requests_per_s']:.0f} "
        f"req/s issued, {data['completed_per_s']:.0f} completed/s, {summary['cancelled']} "
        f"cancelled, {summary['failed_total']} failed; leaked rooms {leaked_rooms} "
        f"(gauges 0, pages free: {data['leak_free']}); clean {clean_after:.1f} s after"
    )
    common.finish(out, "abort_storm", quick, readme, data, figures,
                  lambda path: _plot(path, summary, after))  # fmt: skip
    return data


def _plot(path: Path, summary: dict[str, Any], after: dict[str, Any]) -> None:
    with common.figure(path, 1, 2, figsize=(8, 3.4), dpi=90) as (a1, a2):
        keys = ["completed", "cancelled", "timeouts", "failed_total"]
        a1.bar(keys, [summary[k] for k in keys], color=["tab:green", "tab:orange", "tab:red", "k"])
        a1.set_title("client outcomes", fontsize=9)
        a1.tick_params(axis="x", labelsize=7)
        names = ["rooms", "queue_gauges_sum", "pages_in_use"]
        for i, role in enumerate(after):
            a2.bar(
                [x + i * 0.4 for x in range(3)], [after[role][n] for n in names], 0.4, label=role
            )
        a2.set_xticks(range(3), names, fontsize=7)
        a2.set_ylim(0, max(1, *(after[r][n] for r in after for n in names)))
        a2.set_title("left behind afterwards (must be 0)", fontsize=9)
        a2.legend(fontsize=7)


def main(argv: list[str] | None = None) -> None:
    common.main(
        __doc__ or "", run, argv, show=lambda d: {k: v for k, v in d.items() if k != "after"}
    )


if __name__ == "__main__":
    main()
