"""The vLLM tier's session fixture: ONE real PDDeployment (engine vllm) per test session.

Why once: a real `vllm serve` costs ~3 GB PSS and minutes to start on two busy cores, so the
pair is deployed the first time a `vllm` test asks for it and shared by every scenario after it,
with one operator process (Enforce) watching its namespace. A scenario that kills or freezes an
engine restores it (or lets pdwarden or the kubelet restart it) before it ends. The venv is built
(or reused) first; only if it cannot be built are the tests skipped, with the build's error as
the reason.
The pair's start-up time is printed for the tier's cost accounting.

Before any scenario, the pair must move KV: PREFLIGHT_ROUNDS rounds of PREFLIGHT_CONCURRENT PD
requests sent straight to the pods (stock vLLM, no router of ours). A pair that cannot is the
rig's fault, never pdwarden's, and every scenario would fail for it in its own way: the tier
errors at once, naming the round and the first failure. Such a pair was seen on these machines
until 2026-12-06: vLLM's NIXL worker pinned both engines' model threads to the same core, where
they starved each other (0-1.6 tokens/s, steps stalled 20-40 s); the pods now keep it off
(keep_affinity.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e import enginepair
from e2e.enginepair import EnginePair
from e2e.fixtures import Cluster
from e2e.vllm import cache_root, ensure_venv
from e2e.vllm.client import pd_complete
from e2e.vllm.pods import STARTUP_SECONDS, pd_deployment
from e2e.vllm.tinymodel import ensure_model
from pdwarden.api import RemediationSpec

NAME = "pd"
# The tier runs at pdwarden's defaults (what a user gets), read from the API model: scrape
# interval, wedge window, restart delay, and the pair canary's quiet window and leg deadline.
_DEFAULTS = RemediationSpec()
SCRAPE, WEDGE_AFTER = _DEFAULTS.scrape_interval_seconds, _DEFAULTS.wedge_after_seconds
RESTART_AFTER = _DEFAULTS.restart_after_seconds
QUIET, LEG = _DEFAULTS.canary.quiet_seconds, _DEFAULTS.canary.first_deadline_seconds
# Enforce with every action (RestartPrefill is opt-in and needs AbortRequests listed): healthy
# scenarios must draw none, a frozen engine its repair only. A frozen decode is restarted
# RESTART_AFTER seconds after its cordon; a restarted pod cold-starts in minutes here, during
# which it is not ready or stale, and nothing is done to a pod in either state.
ACTIONS = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]


# The vLLM tier's pair (kept under this name for the tier's tests).
VllmPD = EnginePair


@dataclass(frozen=True)
class VllmModel:
    venv: Path
    path: Path  # the tiny model's directory


@pytest.fixture(scope="session")
def vllm_model() -> VllmModel:
    """The stock vLLM venv and the tiny model, built once (skips the tier if they cannot be)."""
    try:
        venv = ensure_venv()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"the stock vLLM venv cannot be built here (make vllm-venv): {exc}")
    return VllmModel(venv, ensure_model(venv, cache_root()))


PREFLIGHT_ROUNDS, PREFLIGHT_CONCURRENT, PREFLIGHT_SECONDS = 8, 3, 45


def preflight(prefill: str, decode: str) -> str:
    """Why the pair at these pod IPs cannot serve the tier ("" when it can): PD requests sent
    straight to the pods, a few at once, each answered within PREFLIGHT_SECONDS a leg."""
    return enginepair.preflight_rounds(
        lambda text: pd_complete(prefill, decode, text, 4, timeout=PREFLIGHT_SECONDS),
        "vLLM", PREFLIGHT_ROUNDS, PREFLIGHT_CONCURRENT, 2 * PREFLIGHT_SECONDS + 15,
    )  # fmt: skip


def deployed(
    cluster: Cluster, doc: dict[str, Any], prefix: str, log: Path
) -> AbstractContextManager[EnginePair]:
    """`doc`'s vLLM pair, Ready and past the preflight, deleted afterwards (e2e/enginepair.py)."""
    return enginepair.deployed(
        cluster, doc, prefix, log, startup_seconds=STARTUP_SECONDS, preflight=preflight
    )


@pytest.fixture(scope="session")
def vllm_pd(
    cluster: Cluster, crd: str, vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPD]:
    doc = pd_deployment(str(vllm_model.path), NAME, mode="Enforce", actions=ACTIONS)
    with deployed(cluster, doc, "vllm", tmp_path_factory.mktemp("vllm") / "operator.log") as pd:
        yield pd
