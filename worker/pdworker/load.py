"""The load generator: N concurrent clients, like a harness of parallel agents.

Each client sends requests with random prompt and output lengths; a fraction of them is cancelled
at a random moment (the connection is closed, as a user or agent abandoning a call does), which
lands before, during or after the KV transfer. The summary counts what the workers should count,
so tests can compare it with the workers' metrics.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp


def parse_range(text: str) -> tuple[int, int]:
    """`64` or `16:256` (inclusive, uniform)."""
    lo, _, hi = text.partition(":")
    low, high = int(lo), int(hi or lo)
    if low < 1 or high < low:
        raise ValueError(f"bad range {text!r}: want N or LOW:HIGH with 1 <= LOW <= HIGH")
    return low, high


@dataclass
class LoadConfig:
    url: str
    clients: int = 30
    requests: int | None = 100
    duration: float | None = None
    prompt_len: tuple[int, int] = (16, 256)
    output_len: tuple[int, int] = (1, 16)
    cancel_fraction: float = 0.0
    cancel_max_ms: float = 200.0
    timeout: float = 120.0
    seed: int | None = None
    vocab: int = 4096


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def run_load(cfg: LoadConfig) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    url = cfg.url.rstrip("/") + "/generate"
    counts: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    latencies: list[float] = []
    totals = {"tokens": 0, "kv_bytes": 0, "prompt_tokens": 0}
    issued = 0
    started = time.monotonic()
    stop_at = started + cfg.duration if cfg.duration else None

    def next_index() -> int | None:
        nonlocal issued
        if cfg.requests is not None and issued >= cfg.requests:
            return None
        if stop_at is not None and time.monotonic() >= stop_at:
            return None
        issued += 1
        return issued

    async def one(session: aiohttp.ClientSession) -> None:
        n = rng.randint(*cfg.prompt_len)
        body = {
            "input_ids": [rng.randrange(cfg.vocab) for _ in range(n)],
            "max_new_tokens": rng.randint(*cfg.output_len),
        }
        cancel_after = None
        if rng.random() < cfg.cancel_fraction:
            cancel_after = rng.uniform(0, cfg.cancel_max_ms) / 1000
        t0 = time.monotonic()

        async def call() -> tuple[int, dict[str, Any]]:
            async with session.post(url, json=body) as resp:
                data = await resp.json(content_type=None)
                return resp.status, data if isinstance(data, dict) else {}

        try:
            status, data = await asyncio.wait_for(
                call(), timeout=cancel_after if cancel_after is not None else cfg.timeout
            )
        except TimeoutError:
            counts["cancelled" if cancel_after is not None else "timeout"] += 1
            return
        except (aiohttp.ClientError, ValueError) as exc:
            failed[f"client:{type(exc).__name__}"] += 1
            return
        if status == 200 and data.get("ok"):
            counts["completed"] += 1
            latencies.append(time.monotonic() - t0)
            totals["tokens"] += len(data.get("output_ids", []))
            totals["kv_bytes"] += int(data.get("kv_bytes", 0))
            totals["prompt_tokens"] += int(data.get("prompt_tokens", 0))
        else:
            failed[str(data.get("reason", f"http_{status}"))] += 1

    async def client(session: aiohttp.ClientSession) -> None:
        while next_index() is not None:
            await one(session)

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(cfg.clients)))
    elapsed = time.monotonic() - started
    return {
        "requests": issued,
        "completed": counts["completed"],
        "cancelled": counts["cancelled"],
        "timeouts": counts["timeout"],
        "failed": dict(failed),
        "failed_total": sum(failed.values()),
        "latency_s": {
            "p50": round(percentile(latencies, 0.50), 6),
            "p99": round(percentile(latencies, 0.99), 6),
            "mean": round(sum(latencies) / len(latencies), 6) if latencies else 0.0,
        },
        "generated_tokens": totals["tokens"],
        "prompt_tokens": totals["prompt_tokens"],
        "kv_bytes": totals["kv_bytes"],
        "duration_s": round(elapsed, 3),
        "requests_per_s": round(issued / elapsed, 2) if elapsed else 0.0,
        "kv_gbytes_per_s": round(totals["kv_bytes"] / elapsed / 1e9, 4) if elapsed else 0.0,
    }


def format_summary(s: dict[str, Any]) -> str:
    failed = ", ".join(f"{k}={v}" for k, v in sorted(s["failed"].items())) or "none"
    return (
        f"requests {s['requests']} in {s['duration_s']}s ({s['requests_per_s']}/s): "
        f"completed {s['completed']}, cancelled {s['cancelled']}, timeouts {s['timeouts']}, "
        f"failed {s['failed_total']} ({failed})\n"
        f"latency p50 {s['latency_s']['p50'] * 1000:.1f} ms, "
        f"p99 {s['latency_s']['p99'] * 1000:.1f} ms; "
        f"generated tokens {s['generated_tokens']}; KV moved {s['kv_bytes']} bytes "
        f"({s['kv_gbytes_per_s']} GB/s)"
    )


def write_json(path: str, summary: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
