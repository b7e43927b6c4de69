"""A PDRemediationPolicy with `engine: sglang` over a REAL SGLang pair that pdwarden did not create.

The shape other tools deploy: two plain StatefulSets of stock `python3 -m sglang.launch_server`
(the pod templates pdwarden would render, made foreign: e2e/foreign.py), no router, requests
sent the way sglang-router does (both legs at once with a bootstrap room). The policy selects the
pods by label at pdwarden's defaults and, in Enforce:

1. every selected pod is eligible and a few PD requests draw no finding and no action over a
   whole wedge window;
2. the idle pair's pair canaries move KV (their PD request finds the prefill's bootstrap port
   on its command line); then the idle prefill's scheduler frozen (SIGSTOP of
   `sglang::scheduler`, nothing in flight): the next pair canaries (both sides' own /health)
   get no answer from the prefill while the decode answers, the policy's RestartPrefill deletes
   it, its StatefulSet brings a new one, and the pair serves again.

Its own module, before test_sglang_real.py's: its pair is gone before that one starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.fixtures import Cluster
from e2e.foreign import POLICY_CYCLES, Foreign, deployed, policy
from e2e.repair_times import record
from e2e.sglang.client import pd_generate
from e2e.sglang.faults import freeze_scheduler
from e2e.sglang.fixtures import GONE_SECONDS, SCRAPE, WEDGE_AFTER, SGLangModel, preflight
from e2e.sglang.pods import HTTP_PORT, STARTUP_SECONDS, pd_deployment
from e2e.vllm.faults import thaw

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.sglang]
APP = "sglang-foreign"


@pytest.fixture(scope="module")
def foreign(
    cluster: Cluster, crd: str, sglang_model: SGLangModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Foreign]:
    # SGLang's RestartPrefill comes with AbortRequests (the API refuses it alone).
    the_policy = policy(APP, "sglang", HTTP_PORT, mode="Enforce",
                 actions=["AbortRequests", "RestartPrefill"])  # fmt: skip
    log = Path(tmp_path_factory.mktemp("sglp")) / "op.log"
    doc = pd_deployment(str(sglang_model.path), APP)
    with deployed(cluster, doc, the_policy, log, startup_seconds=STARTUP_SECONDS,
                  preflight=preflight, wait_gone=GONE_SECONDS) as pool:  # fmt: skip
        yield pool


def test_the_policy_selects_the_real_pair_and_healthy_requests_draw_nothing(
    foreign: Foreign,
) -> None:
    def selected() -> bool:
        st = foreign.status()
        roles = [st.get(r) or {} for r in ("prefill", "decode")]
        return all(r.get("eligible") == 1 for r in roles) and not st.get("refused")

    foreign.cluster.wait_until("both pods selected and eligible", selected, 60)
    for i in range(3):
        answer = pd_generate(foreign.ip("prefill"), foreign.ip("decode"), f"healthy {i}", 8)
        assert answer["meta_info"]["completion_tokens"] == 8
    # A whole wedge window of the policy's cycles after the requests: a finding would be there.
    foreign.operator.wait_cycles(
        WEDGE_AFTER // SCRAPE, metric=POLICY_CYCLES, timeout=WEDGE_AFTER * 4
    )
    st = foreign.status()
    assert not st.get("wedges") and not foreign.ledger(), st


def test_an_idle_frozen_foreign_prefill_is_found_by_its_health_and_restarted(
    foreign: Foreign,
) -> None:
    prefill, decode_ip = foreign.pod("prefill"), foreign.ip("decode")
    uid = prefill["metadata"]["uid"]
    # An idle pool pdwarden watches: its pair has been asked, and the canary's KV request
    # moved KV (the bootstrap port read from the foreign prefill's own command line).
    foreign.cluster.wait_until(
        "a pair canary through the idle foreign pair that moved KV",
        lambda: foreign.operator.metric("pdwarden_pair_canaries_total", outcome="decoded") > 0,
        timeout=WEDGE_AFTER * 4,
    )
    frozen = freeze_scheduler(uid)
    frozen_at = time.monotonic()
    try:
        (entry,) = foreign.cluster.wait_until(
            "the policy's RestartPrefill in its ledger",
            lambda: [
                e for e in foreign.ledger() if (e["action"], e["uid"]) == ("RestartPrefill", uid)
            ],
            WEDGE_AFTER + 240,
        )
        took = time.monotonic() - frozen_at
        print(f"[sglang] idle frozen foreign prefill -> RestartPrefill {took:.0f}s after the "
              f"freeze: {entry['reason'][:160]}", flush=True)  # fmt: skip
        assert entry["reason"].startswith("PrefillDead: pair canary"), entry
    finally:
        thaw(frozen)
    foreign.cluster.wait_until(
        "a new prefill pod from the StatefulSet, Ready",
        lambda: foreign.ready() and foreign.pod("prefill")["metadata"]["uid"] != uid,
        STARTUP_SECONDS,
    )
    answer = pd_generate(foreign.ip("prefill"), decode_ip, "serving again", 4)
    assert answer["meta_info"]["completion_tokens"] == 4
    record("sglang", "idle pool, frozen prefill scheduler", action="RestartPrefill",
           action_seconds=took, serving_seconds=time.monotonic() - frozen_at)  # fmt: skip
    print(f"[sglang] foreign pair serving again {time.monotonic() - frozen_at:.0f}s after the "
          "freeze", flush=True)  # fmt: skip
    assert [e["action"] for e in foreign.ledger()] == ["RestartPrefill"]  # one repair only
