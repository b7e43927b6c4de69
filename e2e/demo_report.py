"""The demo's results: the summary table, demo-output/summary.json and demo-output/timeline.png.

Why: a user should leave the demo with one picture that shows the wedge and the repair (queue
gauges per pod over time, the operator's actions marked where they happened) and numbers they
can quote; keeping the rendering apart keeps the scenario free of matplotlib.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from e2e.demo_observe import Sample
from pdworker import contract as pdw

GAUGES = {
    "prefill": [
        (pdw.PREFILL_BOOTSTRAP_QUEUE, "bootstrap queue"),
        (pdw.PREFILL_INFLIGHT_QUEUE, "inflight queue (KV transfer pending)"),
    ],
    "decode": [
        (pdw.DECODE_PREALLOC_QUEUE, "prealloc queue"),
        (pdw.DECODE_TRANSFER_QUEUE, "transfer queue (waiting for KV)"),
        (pdw.DECODE_RUNNING, "running"),
    ],
}
ACTION_COLORS = {
    "FailRooms": "#d62728",
    "CordonDecode": "#ff7f0e",
    "RestartDecode": "#9467bd",
    "UncordonDecode": "#2ca02c",
}


def worker_failures(samples: list[Sample]) -> dict[str, int]:
    """Failures counted by the workers, by reason: the last value of each pod incarnation."""
    last: dict[tuple[str, str, str], float] = {}
    for s in samples:
        incarnation = next((k for k in s.values if k.startswith(pdw.INCARNATION_INFO)), "")
        for key, value in s.values.items():
            if key.startswith(f'{pdw.REQUESTS_FAILED}{{reason="'):
                last[(s.pod, incarnation, key)] = value
    out: Counter[str] = Counter()
    for (_, _, key), value in last.items():
        out[key.split('"')[1]] += int(value)
    return {k: v for k, v in sorted(out.items()) if v}


def merge_loads(loads: list[dict[str, Any]]) -> dict[str, Any]:
    failed: Counter[str] = Counter()
    for s in loads:
        failed.update(s.get("failed", {}))
    return {
        "requests": sum(s["requests"] for s in loads),
        "completed": sum(s["completed"] for s in loads),
        "cancelled_by_client": sum(s["cancelled"] for s in loads),
        "timeouts": sum(s["timeouts"] for s in loads),
        "failed": dict(sorted(failed.items())),
    }


def format_table(summary: dict[str, Any]) -> str:
    load = summary["load"]
    failed = ", ".join(f"{k} {v}" for k, v in load["failed"].items()) or "none"
    worker = ", ".join(f"{k} {v}" for k, v in summary["worker_failures"].items()) or "none"
    wedges = ", ".join(f"{k} {v}" for k, v in summary["wedges_detected"].items()) or "none"
    acts = ", ".join(f"{k} {v}" for k, v in summary["actions"].items()) or "none"
    ttr = summary["time_to_recovery_s"]
    rows = [
        ("requests sent", str(load["requests"])),
        ("requests served", f"{load['completed']}"),
        (
            "cancelled by clients",
            f"{load['cancelled_by_client']} (on purpose, in the abort bursts)",
        ),
        ("timed out at clients", str(load["timeouts"])),
        ("failed, seen by clients", failed),
        ("failed, counted by workers", worker),
        ("", "(aborted: cancellations; admin: rooms failed by pdwarden)"),
        ("wedges detected", wedges),
        ("actions taken", acts),
        ("recovery: abort race", _secs(ttr.get("abort_race"), "wedge onset -> rooms failed")),
        ("stalled decode cordoned", _secs(ttr.get("stalled_decode_cordoned"), "stall -> cordon")),
        ("recovery: stalled decode", _secs(ttr.get("stalled_decode"), "stall -> pod serving")),
        ("after recovery", summary["after_recovery"]),
        ("recovered", "yes" if summary["recovered"] else "NO: " + "; ".join(summary["problems"])),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 60)
    body = "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
    return f"{line}\n  pdwarden demo: summary\n{line}\n{body}\n{line}"


def _secs(value: float | None, what: str) -> str:
    return "n/a" if value is None else f"{value:.1f} s ({what})"


def write_json(path: Path, summary: dict[str, Any]) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def write_samples(path: Path, samples: list[Sample]) -> None:
    """Every scrape, one JSON object a line: t (unix seconds), pod, role, values."""
    with path.open("w") as fh:
        for s in samples:
            fh.write(json.dumps(dataclasses.asdict(s), sort_keys=True) + "\n")


def plot_timeline(
    path: Path,
    samples: list[Sample],
    ledger: list[dict[str, Any]],
    *,
    marks: list[tuple[float, str]],
    spans: list[tuple[float, float, str]],
    t0: float,
) -> None:
    """Queue gauges per worker pod over time; operator actions and injected faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_pod: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_pod[s.pod].append(s)
    workers = sorted(p for p, ss in by_pod.items() if ss[0].role in GAUGES)
    routers = sorted(p for p, ss in by_pod.items() if ss[0].role == "router")
    rows = 1 + len(workers)
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(13, 1.2 + 2.2 * rows), squeeze=False)
    panels = [a[0] for a in axes]
    _plot_router(panels[0], [s for p in routers for s in by_pod[p]], t0)
    for ax, pod in zip(panels[1:], workers, strict=True):
        role = by_pod[pod][0].role
        for key, label in GAUGES[role]:
            ts, ys = _with_gaps([(s.t - t0, s.values.get(key, 0.0)) for s in by_pod[pod]])
            ax.step(ts, ys, where="post", label=label, lw=1.6)
        ax.set_title(f"{pod} ({role})", loc="left", fontsize=10)
        ax.set_ylabel("requests")
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)
        _mark_actions(ax, pod, ledger, t0)
    for ax in panels:
        ax.grid(alpha=0.3)
        for start, end, _ in spans:
            ax.axvspan(start - t0, end - t0, color="grey", alpha=0.15, lw=0)
        for x, _ in marks:
            ax.axvline(x - t0, color="black", lw=1.2, ls="--")
    for start, _, label in spans:
        _label(panels[0], start - t0, label, "dimgray")
    for x, label in marks:
        _label(panels[0], x - t0, label, "black")
    panels[-1].set_xlabel("seconds since the demo started")
    fig.suptitle(
        "pdwarden demo: queue gauges of every worker pod, sampled each second. Solid lines: "
        "operator actions on (or for) that pod; dashed: fault injected; grey: abort bursts",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _with_gaps(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Break the line where the pod was not scraped (deleted, restarting)."""
    ts: list[float] = []
    ys: list[float] = []
    for t, y in points:
        if ts and t - ts[-1] > 2.5:
            ts.append(ts[-1] + 1)
            ys.append(float("nan"))
        ts.append(t)
        ys.append(y)
    return ts, ys


def _mark_actions(ax: Any, pod: str, ledger: list[dict[str, Any]], t0: float) -> None:
    """Actions on this pod (or failing rooms bound for it): a line each, one label per burst of
    the same action; labels close together are set side by side."""
    mine = [e for e in ledger if pod in (e["pod"], e.get("peer"))]
    last_x, shift, group_end = -1e9, 0, -1
    for i, e in enumerate(mine):
        x, color = e["t"] - t0, ACTION_COLORS.get(e["action"], "black")
        ax.axvline(x, color=color, lw=1.8 if e["pod"] == pod else 1.0)
        if i <= group_end:
            continue  # labelled with its group
        group = [e]
        for nxt in mine[i + 1 :]:
            if nxt["action"] != e["action"] or nxt["t"] - group[-1]["t"] > 4:
                break
            group.append(nxt)
        group_end = i + len(group) - 1
        text = e["action"] if len(group) == 1 else f"{e['action']} x{len(group)}"
        if e["action"] == "FailRooms":
            text += f" ({sum(g['rooms'] for g in group)} rooms)"
        shift = shift + 10 if x - last_x < 3 else 0
        last_x = x
        _label(ax, x, text, color, shift)


def _label(ax: Any, x: float, text: str, color: str, shift: float = 0) -> None:
    if text:
        ax.annotate(
            text, (x, 1), xycoords=("data", "axes fraction"), xytext=(2 + shift, -3),
            textcoords="offset points", va="top", ha="left", fontsize=8, color=color,
            rotation=90,
        )  # fmt: skip


def _plot_router(ax: Any, samples: list[Sample], t0: float) -> None:
    """Served and failed requests per second at the router (counter deltas between scrapes)."""
    samples = sorted(samples, key=lambda s: s.t)
    ts, served, failed = [], [], []
    for prev, cur in itertools.pairwise(samples):
        dt = cur.t - prev.t
        if dt <= 0:
            continue
        ts.append(cur.t - t0)
        served.append(max(0.0, _sum(cur, "completed") - _sum(prev, "completed")) / dt)
        failed.append(max(0.0, _sum(cur, "failed") - _sum(prev, "failed")) / dt)
    ax.plot(ts, served, color="#1f77b4", label="served /s")
    ax.plot(ts, failed, color="#d62728", label="failed or aborted /s")
    ax.set_title("router: requests per second", loc="left", fontsize=10)
    ax.set_ylabel("req/s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)


_REQUESTS = {"completed": pdw.REQUESTS_COMPLETED, "failed": pdw.REQUESTS_FAILED}


def _sum(sample: Sample, kind: str) -> float:
    prefix = _REQUESTS[kind]
    return sum(v for k, v in sample.values.items() if k.startswith(prefix))
