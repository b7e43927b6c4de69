"""Record what the vLLM adapter reads from a REAL vLLM PD pair under healthy load (fixture maker).

Usage (a pair up, e.g. the one e2e/vllm deploys, or two `vllm serve` processes by hand):

    [LOOPS=6] python tests/remediation/data/record_vllm_samples.py PREFILL DECODE SECONDS OUT.json

It runs LOOPS client loops through vLLM's PD protocol (prefill with do_remote_decode and
max_tokens 1, then decode with the returned kv_transfer_params; random prompt and output lengths)
and meanwhile scrapes both servers once a second, keeping each body as the Sample that
`parse_metrics(..., "vllm")` makes of it. Detection tests replay the series: a healthy pair must
give no finding. Output: {"prefill": [sample...], "decode": [sample...], "requests": N}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import threading
import time
import urllib.request

from pdwarden.remediation.scrape.samples import parse_metrics

LOOPS = int(os.environ.get("LOOPS", "6"))
FIELDS = ("at", "running", "waiting_queue", "transfer_queue", "reading_queue",
          "generated_tokens", "prefill_tokens", "kv_transfers", "failed", "completed",
          "kv_expired", "late_notifications")  # fmt: skip


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def client(prefill: str, decode: str, stop: float, done: list[int], seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop:
        words = " ".join(rng.choice(["the", "cache", "of", "prefill", "to"]) for _ in range(20))
        body = {"model": "tiny", "prompt": words, "max_tokens": rng.randint(8, 64),
                "ignore_eos": True}  # fmt: skip
        first = post(f"{prefill}/v1/completions", {**body, "max_tokens": 1,
                     "kv_transfer_params": {"do_remote_decode": True}})  # fmt: skip
        post(
            f"{decode}/v1/completions", {**body, "kv_transfer_params": first["kv_transfer_params"]}
        )
        done.append(1)


def main() -> None:
    prefill, decode, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    stop = time.monotonic() + seconds
    done: list[int] = []
    loops = [
        threading.Thread(target=client, args=(prefill, decode, stop, done, i)) for i in range(LOOPS)
    ]
    for t in loops:
        t.start()
    series: dict[str, list[dict[str, object]]] = {"prefill": [], "decode": []}
    t0 = time.time()
    while time.monotonic() < stop:
        for role, url in (("prefill", prefill), ("decode", decode)):
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
                sample = parse_metrics(resp.read().decode(), time.time() - t0, "vllm")
            row = dataclasses.asdict(sample)
            series[role].append({k: row[k] for k in FIELDS})
        time.sleep(1)
    for t in loops:
        t.join()
    with open(out, "w") as f:
        json.dump({**series, "requests": len(done)}, f, indent=0)
    print(f"{len(done)} requests, {len(series['decode'])} scrapes per pod -> {out}")


if __name__ == "__main__":
    main()
