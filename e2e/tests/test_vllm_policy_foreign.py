"""A PDRemediationPolicy with `engine: vllm` over a REAL vLLM pair that pdwarden did not create.

The llm-d shape: plain StatefulSets of stock `vllm serve` (the pod templates pdwarden would
render, made foreign: no owner, no pdwarden label, no readiness gate; `app`/`role` labels
instead) and no router of ours, requests sent the way llm-d's sidecar sends them (prefill with
`do_remote_decode`, then decode with the prefill's `kv_transfer_params`). The policy selects the
pods by label, scrapes them every 2 s and, in Enforce:

1. every selected pod is eligible and a few PD requests draw no finding and no action;
2. the idle prefill's engine frozen, with no request anywhere (nothing any metric can show): the
   idle pair's next pair canaries (canary.failureThreshold in a row) get no answer from the
   prefill leg while its counters stand still, the policy's RestartPrefill deletes it
   (PrefillDead), its StatefulSet brings a new one and the pair serves again. (A frozen
   prefill WITH a read in flight: test_vllm_pair.py.)

It runs beside the PDDeployment pair of test_vllm_pair.py (idle by then), on the same venv and
model; only the policy's namespace and operator are its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.fixtures import Cluster
from e2e.foreign import POLICY_CYCLES, Foreign, deployed, policy
from e2e.repair_times import record
from e2e.vllm.client import pd_complete
from e2e.vllm.faults import freeze_engine, thaw
from e2e.vllm.fixtures import VllmModel, preflight
from e2e.vllm.pods import HTTP_PORT, STARTUP_SECONDS, pd_deployment

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.vllm]
APP = "vllm-foreign"
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 2, 45, 90
READING = "vllm:num_requests_kv_fetch_by_stage"


@pytest.fixture(scope="module")
def foreign(
    cluster: Cluster, crd: str, vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Foreign]:
    # The policy comes with the pair, so each scenario runs on its own too (bench/repair.py).
    the_policy = policy(APP, "vllm", HTTP_PORT, scrapeIntervalSeconds=SCRAPE,
                 wedgeAfterSeconds=WEDGE_AFTER, restartAfterSeconds=RESTART_AFTER,
                 mode="Enforce", actions=["RestartPrefill"])  # fmt: skip
    log = Path(tmp_path_factory.mktemp("vllmp")) / "op.log"
    doc = pd_deployment(str(vllm_model.path), APP)
    with deployed(cluster, doc, the_policy, log, startup_seconds=STARTUP_SECONDS,
                  preflight=preflight) as pool:  # fmt: skip
        yield pool


def test_the_policy_selects_the_pair_and_healthy_requests_draw_nothing(foreign: Foreign) -> None:
    prefill_ip, decode_ip = (foreign.pod(r)["status"]["podIP"] for r in ("prefill", "decode"))

    def selected() -> bool:
        st = foreign.status()
        roles = [st.get(r) or {} for r in ("prefill", "decode")]
        return all(r.get("eligible") == 1 for r in roles) and not st.get("refused")

    foreign.cluster.wait_until("both pods selected and eligible", selected, 60)
    for i in range(3):
        answer = pd_complete(prefill_ip, decode_ip, f"a healthy request {i}", 8)
        assert answer.decode["usage"]["completion_tokens"] == 8
    # A whole wedge window of the policy's cycles after the requests: a finding would be there.
    foreign.operator.wait_cycles(
        WEDGE_AFTER // SCRAPE, metric=POLICY_CYCLES, timeout=WEDGE_AFTER * 4
    )
    suspects = foreign.operator.metric("pdwarden_pair_canaries_total", outcome="suspect")
    print(f"[vllm] foreign healthy pair: {suspects:.0f} suspect canaries", flush=True)
    st = foreign.status()
    assert not st.get("wedges") and not foreign.ledger(), st
    wedged = next(c for c in st["conditions"] if c["type"] == "Wedged")
    assert wedged["status"] == "False", wedged


def test_an_idle_frozen_foreign_prefill_is_found_by_a_pair_canary_and_restarted(
    foreign: Foreign,
) -> None:
    prefill, decode_ip = foreign.pod("prefill"), foreign.pod("decode")["status"]["podIP"]
    uid = prefill["metadata"]["uid"]
    # An idle pool pdwarden watches: its pair has had a canary through it (the first one makes
    # the pair's KV handshake, under a longer deadline).
    foreign.cluster.wait_until(
        "a pair canary through the idle foreign pair",
        lambda: foreign.operator.metric("pdwarden_pair_canaries_total", outcome="decoded") > 0,
        timeout=WEDGE_AFTER * 4,
    )
    frozen = freeze_engine(uid)
    frozen_at = time.monotonic()
    try:
        (entry,) = foreign.cluster.wait_until(
            "the policy's RestartPrefill in its ledger",
            lambda: [
                e for e in foreign.ledger() if (e["action"], e["uid"]) == ("RestartPrefill", uid)
            ],
            WEDGE_AFTER + 20 * SCRAPE + 60,
        )
        took = time.monotonic() - frozen_at
        print(f"[vllm] idle frozen prefill -> RestartPrefill {took:.0f}s "
              f"after the freeze: {entry['reason']}", flush=True)  # fmt: skip
        assert entry["uid"] == uid and entry["reason"].startswith("PrefillDead: pair canary"), entry
    finally:
        thaw(frozen)
    foreign.cluster.wait_until(
        "a new prefill pod from the StatefulSet, Ready",
        lambda: foreign.ready() and foreign.pod("prefill")["metadata"]["uid"] != uid,
        STARTUP_SECONDS,
    )
    prefill_ip = foreign.pod("prefill")["status"]["podIP"]
    assert (
        pd_complete(prefill_ip, decode_ip, "serving again", 4).decode["usage"]["completion_tokens"]
        == 4
    )
    record("vllm", "idle pool, frozen prefill (no read in flight)", action="RestartPrefill",
           action_seconds=took, serving_seconds=time.monotonic() - frozen_at)  # fmt: skip
    assert [e["action"] for e in foreign.ledger()] == ["RestartPrefill"]  # one repair only
