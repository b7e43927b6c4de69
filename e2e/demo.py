"""`make demo` (`python -m e2e.demo`): wedge a PD deployment on purpose, watch pdwarden repair it.

The story, narrated with timestamps: a local Kubernetes (or the cluster in KUBECONFIG) gets the
CRD and the operator (its Helm chart), then a CPU PDDeployment of real pdworker processes moving
real KV over NIXL, with the two known production bugs switched on. Under load with cancellations,
(1) an abort that races a KV transfer leaves rooms stuck in the prefill inflight queue forever,
and (2) a decode pod stalls; the operator detects both from queue gauges alone, fails the stuck
rooms, cordons the stalled pod and restarts it, and service recovers. Every worker's queue gauges
are sampled once per second; the run ends with a summary table, demo-output/summary.json and
demo-output/timeline.png. Exit status 0 only if everything recovered.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.cluster.controlplane import REPO_ROOT
from e2e.demo_clock import Clock
from e2e.demo_engine import EngineStory
from e2e.demo_pdworker import Scenario, ledger_times
from e2e.demo_report import format_table, plot_timeline, write_json, write_samples
from e2e.demo_setup import Setup, acquire_cluster, install, teardown

ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}  # the real-engine stories, by `--engine`


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "demo-output",
        help="where timeline.png, summary.json and samples.jsonl go (demo-output/)",
    )
    parser.add_argument(
        "--keep-cluster",
        action="store_true",
        help="start the local cluster in --cluster-dir and leave it running (PDWARDEN_DEMO_KEEP=1)",
    )
    parser.add_argument(
        "--operator",
        choices=("helm", "local"),
        default="helm",
        help="install the operator with the Helm chart (default) or run it here",
    )
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        default=REPO_ROOT / ".cluster",
        help="a local cluster running from here is reused (default .cluster, as make cluster-up)",
    )
    parser.add_argument(
        "--engine",
        choices=("pdworker", *ENGINES),
        default="pdworker",
        help="pdworker (default), real vLLM pods (e2e/demo_vllm.py; `make demo ENGINE=vllm`) or "
        "real SGLang pods (e2e/demo_sglang.py; `make demo ENGINE=sglang`)",
    )
    args = parser.parse_args(argv)
    clock = Clock()
    if args.engine in ENGINES:
        clock.say(
            f"pdwarden demo, engine {args.engine}: freeze real {ENGINES[args.engine]} engines, "
            f"watch pdwarden mend them"
        )
        if os.environ.get("KUBECONFIG"):
            clock.say(
                f"the {ENGINES[args.engine]} demo signals the pods' processes on this machine: "
                f"unset KUBECONFIG"
            )
            return 2
        summary = _staged(args, clock, functools.partial(_engine_story, args.engine))
        for line in (summary or {}).get("actions", []):
            clock.say(f"ledger: {line}")
        for line in (summary or {}).get("problems", []):
            clock.say(f"problem: {line}")
        done = "done: pdwarden repaired both"
    else:
        clock.say(
            "pdwarden demo: wedge a prefill/decode deployment on purpose, watch pdwarden repair it"
        )
        summary = _staged(args, clock, _pdworker_story)
        if summary is not None:
            print(format_table(summary), flush=True)
        done = "done: pdwarden repaired every wedge"
    if summary is None:
        return 1
    clock.say(done if summary["recovered"] else "NOT recovered")
    return 0 if summary["recovered"] else 1


Story = Callable[[Setup, Clock, Path], "dict[str, Any] | None"]


def _staged(args: argparse.Namespace, clock: Clock, story: Story) -> dict[str, Any] | None:
    """Acquire a cluster, install, tell `story`, clean up whatever happened; its summary."""
    keep = args.keep_cluster or os.environ.get("PDWARDEN_DEMO_KEEP") == "1"
    out: Path = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    setup: Setup | None = None
    summary: dict[str, Any] | None = None
    try:
        cluster, started = acquire_cluster(clock.say, args.cluster_dir.resolve(), keep)
        setup = Setup(cluster, clock.say, started_local=started, log_dir=out)
        install(setup, args.operator)
        summary = story(setup, clock, out)
    except KeyboardInterrupt:
        clock.say("interrupted")
    except Exception as e:
        clock.say(f"the demo could not run: {type(e).__name__}: {e}")
    finally:
        if setup is not None:
            teardown(setup, keep)
    return summary


def _pdworker_story(setup: Setup, clock: Clock, out: Path) -> dict[str, Any] | None:
    where = "KUBECONFIG" if os.environ.get("KUBECONFIG") else "local"
    scenario = Scenario(setup, clock)
    try:
        scenario.run()
    except Exception as e:
        scenario.problems.append(f"the scenario broke: {type(e).__name__}: {e}")
        clock.say(f"the scenario broke: {type(e).__name__}: {e}")
    if scenario.obs is None:
        return None
    summary = scenario.summary(setup.operator, where)
    ledger = ledger_times(summary["ledger"])
    plot_timeline(
        out / "timeline.png",
        scenario.observer.samples,
        ledger,
        marks=scenario.marks,
        spans=scenario.spans,
        t0=clock.t0,
    )
    summary["timeline"] = {"t0": clock.t0, "marks": scenario.marks, "spans": scenario.spans}
    write_json(out / "summary.json", summary)
    write_samples(out / "samples.jsonl", scenario.observer.samples)
    clock.say(f"wrote timeline.png, summary.json and samples.jsonl to {out}")
    return summary


def _engine_story(engine: str, setup: Setup, clock: Clock, out: Path) -> dict[str, Any]:
    """A real engine's story (e2e/demo_vllm.py, e2e/demo_sglang.py) on the same cluster and
    install as the pdworker one."""
    story: EngineStory
    if engine == "vllm":
        from e2e.demo_vllm import VllmStory

        story = VllmStory(setup, clock.say)
    else:
        from e2e.demo_sglang import SGLangStory

        story = SGLangStory(setup, clock.say)
    try:
        story.run()
    except Exception as e:
        story.problems.append(f"the story broke: {type(e).__name__}: {e}")
        clock.say(f"the story broke: {type(e).__name__}: {e}")
    summary = story.summary(setup.operator)
    write_json(out / f"summary-{engine}.json", summary)
    return summary


if __name__ == "__main__":
    sys.exit(main())
