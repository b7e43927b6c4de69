"""Operator cost per scrape cycle at 100-2000 worker pods (quick: 50).

How: a metrics simulator process (`bench._metrics_sim`) serves pdworker's real /metrics text on
one 127.20.x.y address per fake pod (loopback only; one third prefill pods that also answer
/admin/rooms). This process then runs the operator's cycle core over N targets exactly as
`Remediator.cycle` does it between its Kubernetes calls: `WorkerClient.scrape` (bounded
concurrency, deadlines, parsing with prometheus-client), the per-pod sample history,
`detection.detect` and `remediation.plan`. Per cycle: CPU seconds of this process
(`time.process_time`, user + system, all threads), wall time, and RSS afterwards. The Kubernetes
list call (one per deployment per cycle) is not included; kwok was not used because kwok pods
get pod IPs from the node podCIDR (10.x), which must not be scraped here.

Target: 1000 pods at a 5 s interval on well under one core (cpu_per_cycle / 5 s << 1) and
under 300 MB RSS. A cProfile of one cycle at the largest size gives the hot spots.

Each size is measured twice, one after the other in the same run against the same simulator:
with the operator's scrape client as shipped (`http1`: a lean GET over a connection kept alive
per pod) and with every GET through aiohttp (`lean_http=False`, what https pods get), so the
ratio between the two is measured side by side.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import resource
import subprocess
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common, harness
from bench._metrics_sim import pod_ip, role_of
from pdwarden.api import RemediationSpec
from pdwarden.remediation.decide import PodState, plan
from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import detect
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import Sample, Target

INTERVAL = 5.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Cycle:
    def __init__(self, n: int, port: int, lean: bool = True) -> None:
        self.spec = RemediationSpec()
        self.targets = [
            Target(pod=f"pod-{i}", uid=f"uid-{i}", role=role_of(i), ip=pod_ip(i), port=port,
                   rooms=role_of(i) == "prefill")
            for i in range(n)
        ]  # fmt: skip
        self.history: dict[str, deque[Sample]] = {t.uid: deque() for t in self.targets}
        self.client = WorkerClient(lean_http=lean)
        self.errors = 0

    async def once(self) -> None:
        results = await self.client.scrape(self.targets, harness.TOKEN)
        keep = self.spec.wedge_after_seconds + 3 * self.spec.scrape_interval_seconds
        views, decodes = [], []
        for r in results:
            t = r.target
            h = self.history[t.uid]
            if r.sample is not None:
                h.append(r.sample)
                while r.sample.at - h[0].at > keep:
                    h.popleft()
            else:
                self.errors += 1
            views.append(PodView(name=t.pod, role=t.role, uid=t.uid, history=tuple(h),
                                 rooms=r.rooms, stale=r.sample is None, error=r.error))  # fmt: skip
            if t.role == "decode":
                decodes.append(PodState(t.pod, t.uid, ready=r.sample is not None))
        detection = detect(views, self.spec.wedge_after_seconds)
        plan(self.spec, detection, decodes, [], datetime.now(UTC), decode_replicas=len(decodes))


async def measure(n: int, port: int, cycles: int, profile: bool, lean: bool) -> dict[str, Any]:
    cycle = Cycle(n, port, lean)
    await cycle.once()  # warm-up: connections, imports
    cpu, wall = [], []
    for _ in range(cycles):
        c0, w0 = time.process_time(), time.perf_counter()
        await cycle.once()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    hot: list[str] = []
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        await cycle.once()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        hot = [ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip()][-16:]
    rss = rss_mb()
    await cycle.client.close()
    cpu_med = common.stats(cpu)["median"]
    return {
        "pods": n,
        "client": "http1" if lean else "aiohttp",
        "cpu_seconds_per_cycle": common.stats(cpu),
        "cpu_ms_per_pod": cpu_med / n * 1000,
        "wall_seconds_per_cycle": common.stats(wall),
        "cores_at_5s_interval": cpu_med / INTERVAL,
        "rss_mb_after": rss,
        "scrape_errors": cycle.errors,
        "profile_top_tottime": hot,
    }


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    sizes = [50] if quick else [100, 500, 1000, 2000]
    cycles = 2 if quick else 4
    port = harness.free_port()
    started = time.monotonic()
    sim = subprocess.Popen(
        [sys.executable, "-m", "bench._metrics_sim", "--pods", str(max(sizes)), "--port",
         str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert sim.stdout is not None
        if sim.stdout.readline().strip() != "ready":
            raise RuntimeError("metrics simulator did not start")
        rows = [
            asyncio.run(measure(n, port, cycles, lean and n == max(sizes), lean))
            for n in sizes
            for lean in (True, False)
        ]
    finally:
        if sim.stdin:
            sim.stdin.close()
        try:
            sim.wait(timeout=20)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
    at = {r["pods"]: r for r in rows if r["client"] == "http1"}
    old = {r["pods"]: r for r in rows if r["client"] == "aiohttp"}
    key = 1000 if 1000 in at else max(at)
    k = at[key]
    ratios = {
        n: round(at[n]["cpu_seconds_per_cycle"]["median"]
                 / max(old[n]["cpu_seconds_per_cycle"]["median"], 1e-9), 3)
        for n in at
    }  # fmt: skip
    data = {
        "interval_seconds": INTERVAL,
        "cycles": cycles,
        "results": rows,
        "target_1000_pods": {
            "pods": key,
            "cores": k["cores_at_5s_interval"],
            "rss_mb": k["rss_mb_after"],
            "met": k["cores_at_5s_interval"] < 0.5 and k["rss_mb_after"] < 300,
        },
        "cpu_ratio_http1_vs_aiohttp": ratios,
        "wall_seconds": round(time.monotonic() - started, 1),
        "notes": ["cycle = scrape + parse + history + detect + plan; no Kubernetes list call",
                  "kwok not used: its pod IPs are 10.x (node podCIDR), not loopback"],
    }  # fmt: skip
    figures = (
        "; ".join(
            f"{r['pods']} pods: {r['cpu_seconds_per_cycle']['median']:.2f} CPU s/cycle "
            f"({r['cpu_ms_per_pod']:.2f} ms/pod, {r['cores_at_5s_interval']:.2f} core at 5 s), "
            f"wall {r['wall_seconds_per_cycle']['median']:.2f} s, RSS {r['rss_mb_after']:.0f} MB"
            for r in rows
            if r["pods"] in (key, max(at)) and r["client"] == "http1"
        )
        + "; CPU per cycle vs every GET through aiohttp, same run: "
        + ", ".join(f"{n} pods {ratios[n]:.2f} x" for n in sorted(ratios))
    )
    common.finish(out, "operator_scale", quick, readme, data, figures, lambda p: _plot(p, rows))
    return data


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    title = f"operator cost per cycle, {common.machine_note()}"
    with common.figure(path, 1, 2, figsize=(8.5, 3.6), dpi=90, title=title) as (a1, a2):
        for client, style in (("http1", "-"), ("aiohttp", ":")):
            mine = [r for r in rows if r["client"] == client]
            pods = [r["pods"] for r in mine]
            a1.plot(pods, [r["cpu_seconds_per_cycle"]["median"] for r in mine], "o" + style,
                    label=f"CPU s ({client})")  # fmt: skip
            a1.plot(pods, [r["wall_seconds_per_cycle"]["median"] for r in mine], "s" + style,
                    label=f"wall s ({client})")  # fmt: skip
        a1.axhline(INTERVAL, color="gray", lw=0.8, ls=":", label="5 s interval")
        common.label(a1, "worker pods", "seconds per scrape cycle")
        mine = [r for r in rows if r["client"] == "http1"]
        a2.plot([r["pods"] for r in mine], [r["rss_mb_after"] for r in mine], "o-")
        common.label(a2, "worker pods", "RSS (MB)", legend=False)


def main(argv: list[str] | None = None) -> None:
    common.main(__doc__ or "", run, argv, limit=5000)


if __name__ == "__main__":
    main()
