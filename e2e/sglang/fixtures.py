"""The SGLang tier's fixture: ONE real PDDeployment (engine sglang) for the tier's module.

Why once, and why per module: a real SGLang server costs ~3 GB and a minute or more to start on
two busy cores, so the pair is deployed the first time a test of the tier asks for it and shared
by every scenario of the module after it, with one operator process (Enforce) watching its
namespace; it is deleted, and its pods awaited gone, when the module ends, so it never runs beside
the vLLM tier's pair (an idle pair of either engine costs cores this box does not have). A
scenario that freezes or kills an engine lets pdwarden or the kubelet restore it before it ends.
The venv is built (or reused) first; only if it cannot be built are the tests skipped, with the
build's error as the reason.

Before any scenario, the pair must move KV: PREFLIGHT_ROUNDS rounds of PREFLIGHT_CONCURRENT PD
requests sent straight to the pods (stock SGLang, no router), or the tier errors at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e import enginepair
from e2e.enginepair import EnginePair
from e2e.fixtures import Cluster
from e2e.sglang import cache_root, ensure_venv
from e2e.sglang.client import pd_generate
from e2e.sglang.pods import STARTUP_SECONDS, pd_deployment
from e2e.vllm.tinymodel import ensure_model
from pdwarden.api import RemediationSpec

NAME = "pd"
_DEFAULTS = RemediationSpec()
SCRAPE, WEDGE_AFTER = _DEFAULTS.scrape_interval_seconds, _DEFAULTS.wedge_after_seconds
RESTART_AFTER = _DEFAULTS.restart_after_seconds
# Enforce with every action SGLang allows (RestartPrefill is opt-in and needs AbortRequests).
ACTIONS = ["AbortRequests", "RestartPrefill", "CordonDecode", "RestartDecode"]
GONE_SECONDS = 180  # the pair's processes exit on SIGTERM in seconds; the kubelet kills at 30 s


@dataclass(frozen=True)
class SGLangModel:
    venv: Path
    path: Path  # the tiny model's directory


@pytest.fixture(scope="session")
def sglang_model() -> SGLangModel:
    """The stock SGLang venv and the tiny model, built once (skips the tier if they cannot be)."""
    try:
        venv = ensure_venv()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"the stock SGLang venv cannot be built here (make sglang-venv): {exc}")
    return SGLangModel(venv, ensure_model(venv, cache_root()))


PREFLIGHT_ROUNDS, PREFLIGHT_CONCURRENT, PREFLIGHT_SECONDS = 4, 3, 45


def preflight(prefill: str, decode: str) -> str:
    """Why the pair at these pod IPs cannot serve the tier ("" when it can)."""
    return enginepair.preflight_rounds(
        lambda text: pd_generate(prefill, decode, text, 4, timeout=PREFLIGHT_SECONDS),
        "SGLang", PREFLIGHT_ROUNDS, PREFLIGHT_CONCURRENT, PREFLIGHT_SECONDS + 15,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sglang_pd(
    cluster: Cluster,
    crd: str,
    sglang_model: SGLangModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EnginePair]:
    doc = pd_deployment(str(sglang_model.path), NAME, mode="Enforce", actions=ACTIONS)
    log = tmp_path_factory.mktemp("sglang") / "operator.log"
    with enginepair.deployed(
        cluster,
        doc,
        "sglang",
        log,
        startup_seconds=STARTUP_SECONDS,
        preflight=preflight,
        wait_gone=GONE_SECONDS,
    ) as pair:
        yield pair
