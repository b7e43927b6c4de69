"""What the fleet bench makes of its raw readings: scrape periods, the goals, the README row, the
picture, and py-spy's profile folded into hot spots.

Why separate from `bench.fleet`: these are pure functions of recorded data (except `py_spy` and
`load`, which read the machine), so the goals' definitions sit in one short place a reader can
check against issue 27.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import common

INTERVAL_SLACK = 1.2  # a pod scraped within 1.2 intervals counts as "inside its interval"
TARGETS = {
    "operator_cores_steady": 0.5,
    "operator_rss_mb_steady": 300.0,
    "reconcile_p99_seconds": 2.0,
    "cycle_inside_interval_seconds": None,  # INTERVAL_SLACK x the interval (set in goals)
    "api_requests_per_s_steady": 5.0,
    "reconcile_cpu_vs_lws": 2.0,
    "wedge_repair_seconds": None,  # wedgeAfterSeconds + 2 intervals (from the run)
    "hostile_other_period_ratio": 1.2,
}


def spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 2),
        "p99": round(common.percentile(values, 0.99), 2),
        "max": round(max(values), 2),
    }


def periods(
    scrapes: Mapping[str, Sequence[float]], owners: Mapping[str, str], exclude: str | None = None
) -> dict[str, Any]:
    """Seconds between consecutive /metrics scrapes of each worker pod, as the pods saw them:
    over all pods (p50, p99), and the worst deployment's p99."""
    all_gaps: list[float] = []
    by_dep: dict[str, list[float]] = {}
    scraped = 0
    for ip, ts in scrapes.items():
        dep = owners.get(ip)
        if dep is None or dep == exclude:
            continue
        scraped += bool(ts)
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        all_gaps += gaps
        by_dep.setdefault(dep, []).extend(gaps)
    expected = sum(1 for d in owners.values() if d != exclude)
    worst = max((common.percentile(g, 0.99) for g in by_dep.values() if g), default=0.0)
    return {
        "pods_scraped": scraped, "pods_expected": expected,
        "period_p50_s": round(statistics.median(all_gaps), 2) if all_gaps else None,
        "period_p99_s": round(common.percentile(all_gaps, 0.99), 2) if all_gaps else None,
        "worst_deployment_period_p99_s": round(worst, 2),
    }  # fmt: skip


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def py_spy(spy: str, pid: int, path: Path, seconds: int) -> dict[str, Any]:
    """py-spy's samples of the operator folded into self and inclusive shares per function."""
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "50",
           "--format", "raw", "--output", str(path), "--nonblocking"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if done.returncode or not path.exists():
        return {"skipped": f"py-spy failed: {done.stderr.strip()[-300:]}"}
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    n = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] + ")"
                  for f in stack.split(";")]  # fmt: skip
        k = int(count)
        n += k
        self_t[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    idle = sum(v for f, v in self_t.items() if "select" in f or "epoll" in f or "wait" in f)
    return {
        "samples": n, "seconds": seconds, "idle_share": round(idle / n, 3) if n else None,
        "self_top": [(f, round(v / n, 3)) for f, v in self_t.most_common(20)] if n else [],
        "inclusive_top": [(f, round(v / n, 3)) for f, v in incl.most_common(40)] if n else [],
    }  # fmt: skip


def _goal(measured: float | None, target: float | None) -> dict[str, Any]:
    met = measured is not None and target is not None and measured <= target
    return {"measured": measured, "target": target, "met": met}


def goals(data: dict[str, Any]) -> dict[str, Any]:
    last = data["results"][-1]
    steady, create = last["steady"], last["create"]
    interval = data["interval_seconds"]
    lws_cpu = last["lws_create"]["lws_cpu_seconds"]
    ratio = create["operator_cpu_seconds"] / lws_cpu if lws_cpu else None
    # A saturated size has no rollout (fleet.py): the largest size that has one speaks for it.
    rolled = next((r for r in reversed(data["results"]) if "rollout" in r), last)
    rollout = rolled.get("rollout") or {"operator_cpu_seconds": 0.0, "seconds": 0.0}
    steady_rate = steady["operator_cores"]
    roll_rate = rolled["steady"]["operator_cores"]
    roll_reconcile = rollout["operator_cpu_seconds"] - roll_rate * rollout["seconds"]
    roll_lws = (rollout.get("lws") or {}).get("lws_cpu_seconds")  # with --lws-rollout
    wedge, hostile = data.get("wedge") or {}, data.get("hostile") or {}
    base = hostile.get("steady_period_p99_s")
    worst_other = max((hostile.get(m, {}).get("period_p99_s") or 0) for m in ("slow", "huge"))
    reconcile_p99 = max(filter(None, (create.get("reconcile_p99_s"), rollout.get(
        "reconcile_p99_s"))), default=None)  # fmt: skip
    out: dict[str, Any] = {
        "fleet": f"{last['deployments']} deployments, {last['pods']} pods",
        "operator_cores_steady": _goal(steady_rate, TARGETS["operator_cores_steady"]),
        "operator_rss_mb_steady": _goal(steady["operator_rss_mb"], 300.0),
        "reconcile_p99_seconds": _goal(reconcile_p99, 2.0),
        "cycle_inside_interval_seconds": _goal(
            steady["worst_deployment_period_p99_s"], INTERVAL_SLACK * interval),
        "api_requests_per_s_steady": _goal(steady["requests_per_s"], 5.0),
        "reconcile_cpu_vs_lws": _goal(round(ratio, 2) if ratio is not None else None, 2.0),
        "wedge_repair_seconds": _goal(wedge.get("seconds"), wedge.get("bound_seconds")),
        "hostile_other_period_ratio": _goal(
            round(worst_other / base, 2) if base else None, 1.2),
    }  # fmt: skip
    if "saturated" in last:
        out["saturated_at"] = {"deployments": last["deployments"], "why": last["saturated"]}
    out["reconcile_cpu_vs_lws"]["rollout_estimate"] = {
        "operator_reconcile_cpu_seconds": round(roll_reconcile, 1),
        "lws_cpu_seconds": roll_lws,
        "ratio": round(roll_reconcile / roll_lws, 2) if roll_lws else None,
        "how": "rollout CPU minus the steady window's rate x the rollout's duration",
    }  # fmt: skip
    return out


def figures(data: dict[str, Any]) -> str:
    g = data["goals"]
    parts = []
    for r in data["results"]:
        s = r["steady"]
        base = r.get("baseline_no_watch_cache")
        parts.append(
            f"{r['deployments']} x 25 pods{' (saturated)' if 'saturated' in r else ''}: "
            f"operator {s['operator_cores']:.2f} core, "
            f"{s['operator_rss_mb']:.0f} MB"
            + (f" (peak {s['operator_peak_rss_mb']:.0f} MB)" if "operator_peak_rss_mb" in s else "")
            + f", {s['requests_per_s']:.2f} API req/s"
            + (f" (no watch cache: {base['requests_per_s']:.0f} req/s, "
               f"{base['operator_cores']:.2f} core)" if base else "")
            + f", scrape period p99 {s['period_p99_s']} s; LWS {s['lws_cores']:.3f} core "
            f"{s['lws_rss_mb']:.0f} MB; Ready p50/p99 {r['create']['ready_seconds'].get('p50')}"
            f"/{r['create']['ready_seconds'].get('p99')} s (LWS "
            f"{r['lws_create']['ready_seconds'].get('p50')}/"
            f"{r['lws_create']['ready_seconds'].get('p99')} s)"
        )  # fmt: skip
    met = [k for k, v in g.items() if isinstance(v, dict) and v.get("met")]
    missed = [k for k, v in g.items() if isinstance(v, dict) and not v.get("met")]
    w = data.get("wedge") or {}
    return "; ".join(parts) + (
        f"; wedge repaired in {w.get('seconds')} s (bound {w.get('bound_seconds')} s); "
        f"goals met: {', '.join(met) or 'none'}; missed: {', '.join(missed) or 'none'}; "
        f"load {data['load_average']['before'][0]}->{data['load_average']['after'][0]}"
    )


def plot(path: Path, data: dict[str, Any]) -> None:
    rows = data["results"]
    n = [r["deployments"] for r in rows]
    title = f"pdwarden fleet vs LWS, {common.machine_note()}"
    with common.figure(path, 1, 3, figsize=(12, 3.6), dpi=90, title=title) as (a1, a2, a3):
        a1.plot(n, [r["steady"]["operator_cores"] for r in rows], "o-", label="pdwarden")
        a1.plot(n, [r["steady"]["lws_cores"] for r in rows], "s--", label="LWS")
        a1.axhline(0.5, color="gray", ls=":", lw=0.8, label="goal 0.5")
        common.label(a1, "deployments (x25 pods)", "cores, steady state")
        a2.plot(n, [r["steady"]["requests_per_s"] for r in rows], "o-", label="watch cache")
        base = [(r["deployments"], r["baseline_no_watch_cache"]["requests_per_s"])
                for r in rows if r.get("baseline_no_watch_cache")]  # fmt: skip
        if base:
            a2.plot(*zip(*base, strict=True), "s--", label="no watch cache")
        a2.axhline(5, color="gray", ls=":", lw=0.8, label="goal 5/s")
        common.label(a2, "deployments (x25 pods)", "operator API requests/s, steady")
        a3.plot(n, [r["create"]["ready_seconds"].get("p99") for r in rows], "o-",
                label="pdwarden p99")  # fmt: skip
        a3.plot(n, [r["lws_create"]["ready_seconds"].get("p99") for r in rows], "s--",
                label="LWS p99")  # fmt: skip
        common.label(a3, "deployments (x25 pods)", "apply -> Ready (s)")
