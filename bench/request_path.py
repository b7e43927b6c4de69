"""Request path: requests/s and p50/p99 latency through router -> prefill -> decode.

Concurrency 1, 8 and 30 clients (`pdworker load`, its own process) for a small KV (64-token
prompts, 128 KiB of KV) and a large one (2048 tokens, 4 MiB), 8 output tokens each, the
configurations interleaved over several rounds; min/median/max over rounds.

Where the time goes: the workers export one transfer histogram, `pdworker_kv_transfer_seconds`
(prefill: wire time, the seconds with at least one of the room's WRITEs in flight; decode:
handshake done -> KV verified, i.e. the whole prefill forward + transfer + checksum), and prefill
its compute time per room (`pdworker_prefill_forward_seconds`, not read here). There is no
histogram for the handshake or decode steps, so the breakdown reports the means of both transfer
views per configuration and the rest of the client latency as "other" (routing, handshake,
queueing, decode steps): measured what exists, and says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import common, harness
from pdworker import contract as pdw

KV = {"small": 64, "large": 2048}  # prompt tokens; 2 KiB of KV per token with these flags
FLAGS = [
    "--layers", "2", "--heads", "4", "--head-dim", "32", "--page-size", "16", "--vocab", "1024",
    "--kv-pages", "8192", "--device", "cpu",
]  # fmt: skip
TOKEN_BYTES = 2 * 2 * 4 * 32 * 4
HIST = pdw.KV_TRANSFER_SECONDS


def _hist(url: str) -> tuple[float, float]:
    s = harness.scrape(url)
    return harness.metric(s, f"{HIST}_sum"), harness.metric(s, f"{HIST}_count")


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    concurrency = [1, 8] if quick else [1, 8, 30]
    rounds = 1 if quick else 3
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    with harness.Workers() as w:
        prefill = w.worker("prefill", *FLAGS)
        decode = w.worker("decode", *FLAGS)
        router = w.router([prefill], [decode])
        w.wait_ready(prefill, decode, router)
        warm = ["--clients", "2", "--requests", "6", "--output-len", "2", "--vocab", "1024"]
        w.load(router, *warm, "--prompt-len", str(KV["large"]))
        for rnd in range(rounds):
            configs = [(kv, c) for kv in KV for c in concurrency]
            k = rnd % len(configs)
            for kv, clients in configs[k:] + configs[:k]:
                n = (8 if quick else max(40, 10 * clients)) if clients > 1 else (6 if quick else 40)
                before = [_hist(p.url) for p in (prefill, decode)]
                summary = w.load(
                    router, "--clients", str(clients), "--requests", str(n),
                    "--prompt-len", str(KV[kv]), "--output-len", "8", "--vocab", "1024",
                    "--seed", str(rnd),
                )  # fmt: skip
                after = [_hist(p.url) for p in (prefill, decode)]
                views = {}
                for role, b, a in zip(("prefill", "decode"), before, after, strict=True):
                    count = a[1] - b[1]
                    views[role] = (a[0] - b[0]) / count if count else 0.0
                runs.setdefault(f"{kv}/c{clients}", []).append(
                    {
                        "requests_per_s": summary["completed"] / summary["duration_s"],  # served
                        "p50_s": summary["latency_s"]["p50"],
                        "p99_s": summary["latency_s"]["p99"],
                        "mean_s": summary["latency_s"]["mean"],
                        "prefill_kv_transfer_mean_s": views["prefill"],
                        "decode_kv_wait_mean_s": views["decode"],
                        "requests": n,
                        "failed": summary["failed"],  # with the worker's default heartbeats
                    }
                )
    table: dict[str, Any] = {}
    for key, rs in runs.items():
        timed = [f for f in rs[0] if f not in ("requests", "failed")]
        row: dict[str, Any] = {f: common.stats(r[f] for r in rs) for f in timed}
        mean = row["mean_s"]["median"]
        dec = row["decode_kv_wait_mean_s"]["median"]
        row["breakdown_median_s"] = {
            "client_mean": mean,
            "prefill_view_wire_time": row["prefill_kv_transfer_mean_s"]["median"],
            "decode_view_forward_transfer_checksum": dec,
            "other_routing_handshake_queueing_decode_steps": max(0.0, mean - dec),
        }
        row["kv_bytes_per_request"] = KV[key.split("/")[0]] * TOKEN_BYTES
        row["failed_by_round"] = [r["failed"] for r in rs]
        table[key] = row
    data = {
        "concurrency": concurrency,
        "rounds": rounds,
        "kv_prompt_tokens": KV,
        "results": table,
        "wall_seconds": round(time.monotonic() - started, 1),
        "notes": [
            "no per-phase histograms for the handshake or decode exist in pdworker; the breakdown "
            f"uses the two views of {HIST} (prefill: wire time) and the "
            "remainder",
        ],
    }
    top = max(concurrency)
    parts = []
    for kv in KV:
        r = table[f"{kv}/c{top}"]
        one = table[f"{kv}/c1"]
        parts.append(
            f"{kv} KV: c1 {one['requests_per_s']['median']:.0f} req/s p50 "
            f"{one['p50_s']['median'] * 1000:.0f} ms; c{top} "
            f"{r['requests_per_s']['median']:.0f} req/s p50 {r['p50_s']['median'] * 1000:.0f} ms "
            f"p99 {r['p99_s']['median'] * 1000:.0f} ms"
        )
    figures = "; ".join(parts)
    common.finish(out, "request_path", quick, readme, data, figures,
                  lambda path: _plot(path, concurrency, table))  # fmt: skip
    return data


def _plot(path: Path, concurrency: list[int], table: dict[str, Any]) -> None:
    title = f"request path router->prefill->decode, {common.machine_note()}"
    with common.figure(path, 1, 2, figsize=(9, 3.8), dpi=90, title=title) as (a1, a2):
        for kv in KV:
            rows = [table[f"{kv}/c{c}"] for c in concurrency]
            a1.plot(concurrency, [r["requests_per_s"]["median"] for r in rows], "o-", label=kv)
            a2.plot(
                concurrency, [r["p50_s"]["median"] * 1000 for r in rows], "o-", label=f"{kv} p50"
            )
            a2.plot(
                concurrency, [r["p99_s"]["median"] * 1000 for r in rows], "s--", label=f"{kv} p99"
            )
        common.label(a1, "concurrent clients", "requests/s (median of rounds)")
        common.label(a2, "concurrent clients", "latency (ms)")


def main(argv: list[str] | None = None) -> None:
    common.main(__doc__ or "", run, argv, show=lambda data: data["results"], limit=3000)


if __name__ == "__main__":
    main()
