"""KV storm: does pdworker keep answering while it moves a lot of KV? (issue 16, item 4)

30 clients, 30% of requests cancelled at random moments, prompts of 16-4096 tokens (quick: 8
clients, 16-1024 tokens, a few seconds), real prefill, decode and router processes with the
DEFAULT heartbeat settings (2 s x 2 failures), KV geometry as in kv_transfer. While the storm
runs, a prober measures how fast the event-loop-served endpoints answer: prefill and decode
`/healthz`, the bootstrap server's `/health` and `/bootstrap/heartbeat` (the route decode's
heartbeats use; the probe sends an unknown agent, which is answered without side effects), every
PROBE_INTERVAL_S each; and, as the floor to read them against, the same probes for a few
seconds before the storm with the workers idle. Reported: p50/p99/max latency per endpoint,
probes that failed, request outcomes by reason (`peer_lost` must be 0), leaks afterwards (rooms,
queue gauges, pages) and checksum mismatches. Goals (not asserted): health p99 < 100 ms, 0
peer_lost, 0 leaks.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench import common, harness
from bench.abort_storm import REASONS, leaks

PROBE_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 5.0
# KV geometry as kv_transfer's CPU run: 8 KiB of KV per token (4096 tokens = 32 MiB).
FLAGS = [
    "--layers", "32", "--heads", "2", "--head-dim", "16", "--page-size", "64", "--vocab", "1024",
    "--kv-pages", "8192",
]  # fmt: skip
# The same on a GPU: the Llama-8B-like geometry (128 KiB per token, 4096 tokens = 512 MiB).
# Pages: the worst case is 30 clients x 4096-token prompts / 64-token pages = 1920 pages held at
# once; 2048 pages x 8 MiB = 16 GiB per pool (one per worker: fine on one H200's 141 GB).
GPU_FLAGS = [
    "--layers", "32", "--heads", "8", "--head-dim", "128", "--page-size", "64", "--vocab", "1024",
    "--dtype", "bfloat16", "--kv-pages", "2048",
]  # fmt: skip


def _probe_once(method: str, url: str, body: bytes | None) -> tuple[float, int]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=PROBE_TIMEOUT_S) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:  # an answer is an answer (auth may refuse the probe)
        status = exc.code
    except (OSError, urllib.error.URLError):
        status = 0
    return time.perf_counter() - t0, status


class Prober:
    """Probes each endpoint every PROBE_INTERVAL_S on its own thread until stopped."""

    def __init__(self, targets: dict[str, tuple[str, str, bytes | None]]) -> None:
        self.targets = targets
        self.latencies: dict[str, list[float]] = {k: [] for k in targets}
        self.failed: dict[str, int] = dict.fromkeys(targets, 0)
        self.statuses: dict[str, dict[str, int]] = {k: {} for k in targets}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(name,), daemon=True) for name in targets
        ]

    def _run(self, name: str) -> None:
        method, url, body = self.targets[name]
        while not self.stop.is_set():
            took, status = _probe_once(method, url, body)
            if status == 0:
                self.failed[name] += 1
            else:
                self.latencies[name].append(took)
                key = str(status)
                self.statuses[name][key] = self.statuses[name].get(key, 0) + 1
            self.stop.wait(max(0.0, PROBE_INTERVAL_S - took))

    def __enter__(self) -> Prober:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=PROBE_TIMEOUT_S + 1)

    def summary(self) -> dict[str, Any]:
        out = {}
        for name, vals in self.latencies.items():
            out[name] = {
                "n": len(vals),
                "p50_ms": common.percentile(vals, 0.5) * 1000,
                "p99_ms": common.percentile(vals, 0.99) * 1000,
                "max_ms": max(vals, default=0.0) * 1000,
                "failed": self.failed[name],
                "statuses": self.statuses[name],
            }
        return out


def run(quick: bool, out: Path, readme: Path | None, device: str = "cpu") -> dict[str, Any]:
    gpu = device.startswith("cuda")
    duration = 8.0 if quick else 60.0
    clients = 8 if quick else 30
    prompt = "16:1024" if quick else "16:4096"
    flags = [*(GPU_FLAGS if gpu else FLAGS), "--device", device]
    started = time.monotonic()
    with harness.Workers() as w:
        prefill = w.worker("prefill", *flags)
        decode = w.worker("decode", *flags)
        router = w.router([prefill], [decode])
        w.wait_ready(prefill, decode, router)
        boot = f"http://{harness.LOOPBACK}:{prefill.bootstrap_port}"
        probe_body = json.dumps({"agent": "bench-probe"}).encode()
        targets = {
            "prefill /healthz": ("GET", f"{prefill.url}/healthz", None),
            "decode /healthz": ("GET", f"{decode.url}/healthz", None),
            "bootstrap /health": ("GET", f"{boot}/health", None),
            "bootstrap /bootstrap/heartbeat": ("POST", f"{boot}/bootstrap/heartbeat", probe_body),
        }
        # The same probes with the workers idle first: on a shared, loaded machine this is the
        # floor the storm figures must be read against.
        with Prober(targets) as idle:
            idle.stop.wait(3.0 if quick else 10.0)
        with Prober(targets) as prober:
            summary = w.load(
                router, "--clients", str(clients), "--duration", str(duration),
                "--cancel-fraction", "0.3", "--cancel-max-ms", "500", "--prompt-len", prompt,
                "--output-len", "1:16", "--vocab", "1024", "--seed", "16", "--timeout", "120",
            )  # fmt: skip
        settled = True
        try:
            harness.wait_for(lambda: w.clean(prefill) and w.clean(decode), 60, "workers clean")
        except TimeoutError:
            settled = False
        left = {"prefill": leaks(w, prefill), "decode": leaks(w, decode)}
    probes = prober.summary()
    worst_p99 = max(p["p99_ms"] for p in probes.values())
    idle_p99 = max(p["p99_ms"] for p in idle.summary().values())
    peer_lost = sum(side["failed_by_reason"]["peer_lost"] for side in left.values())
    mismatches = sum(side["checksum_mismatch"] for side in left.values())
    leaked = sum(side["rooms"] + side["queue_gauges_sum"] + side["pages_in_use"]
                 for side in left.values())  # fmt: skip
    data = {
        "device": device,
        "duration_s": duration,
        "clients": clients,
        "prompt_tokens": prompt,
        "cancel_fraction": 0.3,
        "probe_interval_s": PROBE_INTERVAL_S,
        "probes": probes,
        "probes_idle_before": idle.summary(),
        "load": summary,
        "after": left,
        "settled": settled,
        "goals": {
            "health_p99_lt_100ms": worst_p99 < 100,
            "no_peer_lost": peer_lost == 0,
            "no_leaks": settled and leaked == 0,
            "no_checksum_mismatch": mismatches == 0,
        },
        "reasons": list(REASONS),
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    figures = (
        f"{clients} clients, {prompt} tokens, 30% cancelled, {duration:g} s: "
        f"{summary.get('completed', 0)} completed, {summary.get('cancelled', 0)} cancelled, "
        f"{summary.get('failed_total', 0)} failed; endpoint p99 worst {worst_p99:.0f} ms "
        f"(max {max(p['max_ms'] for p in probes.values()):.0f} ms; idle before: p99 "
        f"{idle_p99:.0f} ms), peer_lost {peer_lost:g}, "
        f"leaked {leaked:g}, checksum mismatches {mismatches:g}"
    )
    name = "kv_storm-gpu" if gpu else "kv_storm"
    common.finish(out, name, quick, readme, data, figures, lambda path: _plot(path, prober))
    return data


def _plot(path: Path, prober: Prober) -> None:
    with common.figure(path, figsize=(7, 4.2), dpi=90) as ax:
        for name, vals in prober.latencies.items():
            ax.plot(range(len(vals)), [v * 1000 for v in vals], label=name, linewidth=0.8)
        ax.axhline(100, color="red", linestyle="--", linewidth=0.8, label="100 ms goal")
        ax.set_yscale("log")
        title = f"endpoint latency under the KV storm, {common.machine_note()}"
        common.label(ax, "probe # (every ~50 ms during the storm)", "answer latency (ms)", title)


def main(argv: list[str] | None = None) -> None:
    show = ("probes", "goals", "wall_seconds")
    common.main(__doc__ or "", run, argv, show=lambda d: {k: d[k] for k in show}, device=True)


if __name__ == "__main__":
    main()
