"""Time to repair at default settings on the real engines, per scenario, beside what the engine
does alone (issue 36).

What runs: the real-engine tiers' fault scenarios (`e2e/tests/test_vllm_pair.py`,
`e2e/tests/test_vllm_policy_foreign.py`, `e2e/tests/test_sglang_policy_foreign.py`,
`e2e/tests/test_sglang_real.py`: stock vLLM and SGLang prefill/decode pods over NIXL on the local
control plane, one pair at a time, pdwarden at its default remediation settings), each recording
its figures through
`e2e.repair_times` (the seconds from the fault to pdwarden's first repairing action and to the
pair serving again). Nothing is simulated and nothing is re-timed here: the figures are the
ones the tiers assert on. Beside each: what the engine and the kubelet do without pdwarden,
from the engine's source (`ENGINE_ALONE`), and the goal (a first repairing action within
`GOAL_SECONDS` of the fault).

`make bench-repair` (~35 min: each pair's start, eight faults, the restarts). No quick mode: the
scenarios need the real engines; `tests/bench/test_repair_report.py` holds the report to its
inputs, and `make test` runs the scenarios themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from e2e.repair_times import ENV

from bench import common
from pdwarden.api import RemediationSpec

ROOT: Final = Path(__file__).resolve().parents[1]
GOAL_SECONDS: Final = 20.0
PAIR: Final = "e2e/tests/test_vllm_pair.py"
FOREIGN: Final = "e2e/tests/test_vllm_policy_foreign.py"
SG_PAIR: Final = "e2e/tests/test_sglang_real.py"
SG_FOREIGN: Final = "e2e/tests/test_sglang_policy_foreign.py"
TESTS: Final = (
    f"{PAIR}::test_a_read_stuck_on_a_frozen_prefill_restarts_the_prefill_and_the_request_is_answered",
    f"{PAIR}::test_a_decode_frozen_behind_its_api_server_is_confirmed_by_a_canary_and_restarted",
    f"{PAIR}::test_a_killed_engine_is_restarted_and_the_pair_serves_again",
    f"{FOREIGN}::test_an_idle_frozen_foreign_prefill_is_found_by_a_pair_canary_and_restarted",
    f"{SG_FOREIGN}::test_an_idle_frozen_foreign_prefill_is_found_by_its_health_and_restarted",
    f"{SG_PAIR}::test_a_frozen_prefill_scheduler_is_found_on_the_prefill_and_restarted",
    f"{SG_PAIR}::test_a_frozen_decode_scheduler_is_cordoned_restarted_and_readmitted_by_the_router",
    f"{SG_PAIR}::test_a_killed_decode_is_left_to_the_kubelet_and_nothing_harms_the_prefill",
)
# SGLang 0.5.23 alone: its scheduler's watchdog thread stops with the scheduler (a SIGSTOP or a
# hang of the whole process), so only a liveness probe on its generating /health restarts it.
_SG_PROBE: Final = (
    "only a liveness probe on /health (SGLang answers 503 after 20 s without its scheduler): "
    "as pdwarden renders it (3 x 30 s) the kubelet restarts the pod after ~1.5-2 min; without "
    "one, never (the router only stops routing to it)"
)
# (engine, scenario) -> (whether the engine and the kubelet repair it without pdwarden, what
# happens then): vLLM 0.32, its source and our measurements on the CPU pair (docs/engines.md).
ENGINE_ALONE: Final[Mapping[tuple[str, str], tuple[bool, str]]] = {
    ("vllm", "frozen prefill, a KV read in flight"): (
        False,
        "never: a KV read has no deadline (nixl/base_worker.py _pop_done_transfers) and /health "
        "stays 200; the request hangs",
    ),
    ("vllm", "frozen decode behind its live API server"): (
        False,
        "never: /health stays 200 (AsyncLLM.check_health fails only once the engine core died); "
        "the prefill frees the KV after kv_lease_duration (30 s) and nothing restarts the decode",
    ),
    ("vllm", "idle pool, frozen prefill (no read in flight)"): (
        False,
        "never: /health stays 200; the first request routed to it hangs",
    ),
    ("vllm", "decode engine killed"): (
        True,
        "the kubelet restarts the container (/health 503 within ~1 s of the crash): nothing for "
        "pdwarden to do, and it does nothing",
    ),
    ("sglang", "frozen prefill scheduler, requests arriving"): (True, _SG_PROBE),
    ("sglang", "frozen decode scheduler, requests arriving"): (True, _SG_PROBE),
    ("sglang", "idle pool, frozen prefill scheduler"): (True, _SG_PROBE),
    ("sglang", "decode killed (every process)"): (
        True,
        "the kubelet restarts the container; the stock router readmits it after its own health "
        "checks: nothing for pdwarden to do, and it restarts nothing",
    ),
}


def defaults() -> dict[str, Any]:
    """The remediation settings every scenario ran at: the API's defaults."""
    spec = RemediationSpec()
    return {
        "scrape_interval_seconds": spec.scrape_interval_seconds,
        "wedge_after_seconds": spec.wedge_after_seconds,
        "restart_after_seconds": spec.restart_after_seconds,
        "canary_quiet_seconds": spec.canary.quiet_seconds,
        "canary_deadline_seconds": spec.canary.deadline_seconds,
        "canary_failure_threshold": spec.canary.failure_threshold,
    }


def report(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The scenarios as recorded, each beside what the engine does alone; every expected
    scenario that recorded nothing is listed under `missing`, and the goal is met only when
    none is missing and every first repairing action came within GOAL_SECONDS."""
    got = {(str(r["engine"]), str(r["scenario"])): dict(r) for r in records}
    rows = []
    for key, (repairs, alone) in ENGINE_ALONE.items():
        r = got.get(key)
        if r is None:
            continue
        action_seconds = r.get("action_seconds")
        rows.append({
            **r,
            "engine_alone": alone,
            "engine_alone_repairs": repairs,
            "goal_met": r.get("action") is None or (
                action_seconds is not None and action_seconds <= GOAL_SECONDS
            ),
        })  # fmt: skip
    missing = [f"{e}: {s}" for e, s in ENGINE_ALONE if (e, s) not in got]
    return {
        "settings": defaults(),
        "goal_seconds": GOAL_SECONDS,
        "scenarios": rows,
        "missing": missing,
        "unexpected": [f"{e}: {s}" for e, s in got if (e, s) not in ENGINE_ALONE],
        "goal_met": not missing and all(r["goal_met"] for r in rows),
    }


def summary(data: Mapping[str, Any]) -> str:
    parts = []
    for r in data["scenarios"]:
        if r.get("action"):
            first = f"{r['action']} {r['action_seconds']:.0f} s"
            if r.get("restart_seconds") is not None:
                first += f" (restart {r['restart_seconds']:.0f} s)"
        else:
            first = "no action (none needed)"
        alone = "the kubelet" if r["engine_alone_repairs"] else "never"
        parts.append(f"{r['scenario']}: {first}, serving again {r['serving_seconds']:.0f} s; "
                     f"engine alone: {alone}")  # fmt: skip
    missing = f"; MISSING: {', '.join(data['missing'])}" if data["missing"] else ""
    return (
        f"defaults, goal <= {data['goal_seconds']:.0f} s to the first action: "
        + "; ".join(parts)
        + f"{missing}; goal met: {data['goal_met']}"
    )


def plot(data: Mapping[str, Any], path: Path) -> None:
    plt = common.pyplot()
    rows = data["scenarios"]
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.8 * len(rows)))
    ys = range(len(rows))
    serving = [r["serving_seconds"] for r in rows]
    action = [r.get("action_seconds") or 0.0 for r in rows]
    ax.barh([y + 0.2 for y in ys], serving, height=0.4, label="fault -> serving again")
    ax.barh([y - 0.2 for y in ys], action, height=0.4, label="fault -> first repairing action")
    for y, r in zip(ys, rows, strict=True):
        alone = "alone: the kubelet" if r["engine_alone_repairs"] else "alone: never"
        ax.text(max(serving) * 1.03, y, alone, va="center", fontsize=8)
    ax.axvline(data["goal_seconds"], color="grey", linestyle=":", label="goal")
    ax.set_yticks(list(ys), [r["scenario"] for r in rows], fontsize=8)
    ax.set_xlabel("seconds after the fault (defaults)")
    ax.set_xlim(0, max(serving) * 1.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def measure() -> list[dict[str, Any]]:
    """Runs the scenarios (pytest, the real engines) and returns what they recorded."""
    with tempfile.TemporaryDirectory(prefix="pdwarden-repair-") as tmp:
        path = Path(tmp) / "repair.jsonl"
        env = {**os.environ, ENV: str(path)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *TESTS]
        done = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the scenarios failed (pytest exit {done.returncode}): no figures")
        lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def run(quick: bool, out: Path, readme: Path | None) -> dict[str, Any]:
    if quick:
        raise SystemExit("bench.repair has no quick mode: it needs the real engines")
    data = report(measure())
    if not data["scenarios"]:
        raise SystemExit("no scenario recorded anything (were the engine tiers skipped?)")
    common.finish(out, "repair", quick, readme, data, summary(data), lambda p: plot(data, p))
    return data


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return common.main(__doc__ or "", run, argv)


if __name__ == "__main__":
    main()
