"""Ten minutes of SIMULATED SGLang pods, probed like real ones, judged the way the operator does.

The pods are e2e/sglang_sim_engine.py's engines (the same code the local cluster runs for the SGLang
image) on a simulated clock: every 0.25 s the scheduler ticks, every 10 s each pod answers a
/health probe the way SGLang 0.5.23 does (a one-token request through its scheduler against a
fake KV peer), every 5 s the operator scrapes every pod's /metrics body. The operator's pure
half then runs as in a cycle: views, detection and the plan with the default remediation
settings. Actions the plan takes are played back on the engines (an abort_all on a prefill; a
cordon leaves a stalled decode as it is), so the test asserts what a user would see: no action
on healthy pods under load, and a repair within wedgeAfterSeconds + one scrape of a wedge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from e2e.sglang_sim import parse_args
from e2e.sglang_sim_engine import TICK, Engine
from prometheus_client import CollectorRegistry, generate_latest

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import PlannedAction, PodState, plan
from pdwarden.remediation.detect.rules import detect
from pdwarden.remediation.memory import (
    DeploymentMemory,
    WorkerPod,
    observation,
    pod_views,
    remember,
)
from pdwarden.remediation.scrape.samples import parse_metrics

PROBE_EVERY = 10.0
TEN_MINUTES = 600.0
# The defaults (scrape every 5 s, wedgeAfterSeconds 60, AbortRequests on) but one of the two
# decode pods may be cordoned (25% of 2 rounds down to none).
SPEC = RemediationSpec(max_unavailable_decode=1)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Fleet:
    """Simulated pods on one clock, and the operator's memory of them."""

    phases: dict[str, str]
    now: float = 0.0
    engines: dict[str, Engine] = field(default_factory=dict)
    registries: dict[str, CollectorRegistry] = field(default_factory=dict)
    mem: DeploymentMemory = field(default_factory=DeploymentMemory)
    ledger: list[LedgerEntry] = field(default_factory=list)
    actions: list[tuple[float, PlannedAction]] = field(default_factory=list)
    findings: list[tuple[float, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, phase in self.phases.items():
            role = "prefill" if name.startswith("p") else "decode"
            args = parse_args(["--model-path", "m", "--disaggregation-mode", role,
                               "--dp-size", "2", "--enable-priority-scheduling"])  # fmt: skip
            self.registries[name] = CollectorRegistry()
            self.engines[name] = Engine(
                args, registry=self.registries[name], clock=lambda: self.now, seed=name
            )
            self.engines[name].set_phase(phase)

    def targets(self) -> list[WorkerPod]:
        return [WorkerPod(n, f"uid-{n}", e.role, f"10.0.0.{i}", False, "sglang",
                          rooms_wait_for_decode_kv=False)  # the rendered pod's defaults
                for i, (n, e) in enumerate(self.engines.items())]  # fmt: skip

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += TICK
            for engine in self.engines.values():
                engine.tick(TICK)
            if self.now % PROBE_EVERY < TICK / 2:
                for engine in self.engines.values():
                    assert engine.health("/health") == 200
            if self.now % SPEC.scrape_interval_seconds < TICK / 2:
                self.cycle()

    def cycle(self) -> None:
        targets = self.targets()
        observations = [
            observation(t.uid, parse_metrics(generate_latest(self.registries[t.name]).decode(),
                                             self.now, "sglang"), None, None)
            for t in targets
        ]  # fmt: skip
        keep = SPEC.wedge_after_seconds + 3 * SPEC.scrape_interval_seconds
        remember(self.mem, observations, keep)
        views = pod_views(targets, {o.uid: o for o in observations}, self.mem, self.now,
                          SPEC.scrape_interval_seconds)  # fmt: skip
        detection = detect(views, SPEC.wedge_after_seconds)
        self.findings += [(self.now, f.pod, f.reason) for f in detection.findings]
        wall = EPOCH + timedelta(seconds=self.now)
        pods = [PodState(t.name, t.uid, ready=True) for t in targets]
        decodes = [p for p in pods if p.name.startswith("d")]
        prefills = [p for p in pods if p.name.startswith("p")]
        decision = plan(
            SPEC, detection, decodes, self.ledger, wall,
            decode_replicas=2, engine="sglang", prefills=prefills,
        )  # fmt: skip
        for action in decision.actions:
            self.actions.append((self.now, action))
            self.ledger.append(LedgerEntry(time=wall, action=action.kind, pod=action.pod,
                                           outcome="Succeeded"))  # fmt: skip
            if action.kind == "AbortRequests":
                self.engines[action.pod].abort_all()


def test_healthy_pods_under_heavy_load_and_probes_get_no_action_for_ten_minutes() -> None:
    """A saturated prefill (its inflight queue never empties, it drains) and two decodes, one
    with short requests, one with four long ones (no request finishes for ten minutes)."""
    fleet = Fleet({"p-0": "healthy", "d-0": "healthy", "d-1": "long"})
    fleet.run(TEN_MINUTES)
    assert fleet.findings == [] and fleet.actions == []
    # The probes really ran where SGLang runs them: on the prefill whenever nothing waited.
    assert fleet.engines["p-0"].probes["ran"] > 0
    assert fleet.engines["d-0"].probes == {"ran": 0, "skipped": 60}


def test_a_probed_prefill_wedge_is_repaired_within_wedge_after_plus_one_scrape() -> None:
    fleet = Fleet({"p-0": "healthy", "d-0": "idle", "d-1": "idle"})
    fleet.run(120.0)
    wedged_at = fleet.now
    fleet.engines["p-0"].set_phase("wedged")
    fleet.run(TEN_MINUTES - 120.0)
    (at, action), *_ = fleet.actions
    assert (action.kind, action.pod) == ("AbortRequests", "p-0")
    assert at - wedged_at <= SPEC.wedge_after_seconds + SPEC.scrape_interval_seconds
    # Probed every 10 s all along, and the abort drained it: one repair, nothing after.
    assert fleet.engines["p-0"].probes["ran"] >= 6
    assert [a.kind for _, a in fleet.actions] == ["AbortRequests"]
    assert fleet.engines["p-0"].state()["held"]["inflight"] == 0


def test_a_probed_stalled_decode_is_cordoned_within_wedge_after_plus_one_scrape() -> None:
    fleet = Fleet({"p-0": "idle", "d-0": "healthy", "d-1": "healthy"})
    fleet.run(60.0)
    stalled_at = fleet.now
    fleet.engines["d-0"].set_phase("stalled")
    fleet.run(3 * SPEC.wedge_after_seconds)
    (at, action), *_ = fleet.actions
    assert (action.kind, action.pod) == ("CordonDecode", "d-0")
    assert at - stalled_at <= SPEC.wedge_after_seconds + SPEC.scrape_interval_seconds
    assert fleet.engines["d-0"].probes["ran"] >= 6  # its transfer queue never blocked them
    assert all(a.pod == "d-0" for _, a in fleet.actions)
