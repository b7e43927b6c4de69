"""The corruption alarm on a REAL vLLM pair: a decode step longer than the prefill's KV lease.

vLLM's prefill frees a request's KV blocks when the decode's lease heartbeats (from its
scheduler steps) stop for `kv_lease_duration`; a decode that then reads them reads blocks the
prefill may have handed to another request, and answers 200. The prefill counts the read's late
notification (`nixl_num_notifications_after_expiry_total`, nixl/pull_worker.py:656-667).
pdwarden's LateNotification needs that count AND an expired lease before it (a client abort
makes late notifications too, without any lease expiring: test_vllm_pair.py's healthy load
drops 200 clients at every stage and draws no Warning).

Here: a pair with the shortest lease pdwarden accepts (6 s), in DryRun. The prefill leg runs;
the decode's engine is frozen (one step that lasts longer than the lease); the decode leg is
sent; the prefill frees the blocks (its expired counter rises); the engine is thawed, reads the
freed blocks and answers; the prefill counts the late notification; pdwarden posts one
LateNotification Warning on the prefill.

Opt-in (PDWARDEN_VLLM_SHORT_LEASE=1): a second real pair costs ~3 min that `make test`, at
its time budget, does not have. Measured runs are in docs/engines.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
from e2e.fixtures import Cluster
from e2e.httpjson import http
from e2e.vllm.client import PREFILL_PARAMS, decode_leg_in_background, metric, url
from e2e.vllm.faults import freeze_engine, thaw
from e2e.vllm.fixtures import VllmModel, VllmPD, deployed
from e2e.vllm.pods import SERVED_NAME, pd_deployment

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.vllm]
OPT_IN = "PDWARDEN_VLLM_SHORT_LEASE"
NAME = "late"
LEASE = 6  # seconds: the least spec.vllm.kvLeaseSeconds takes
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
LATE = "vllm:nixl_num_notifications_after_expiry_total"


def warnings(pair: VllmPD, reason: str) -> list[str]:
    events = json.loads(
        pair.cluster.kubectl(
            "get", "events", "-n", pair.namespace, "--field-selector", f"reason={reason}", "-o",
            "json",
        ).stdout
    )  # fmt: skip
    return [e["message"] for e in events["items"] if e.get("type") == "Warning"]


@pytest.fixture(scope="module")
def short_pair(
    cluster: Cluster, crd: str, vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPD]:
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"opt-in ({OPT_IN}=1): a second real vLLM pair, ~3 min")
    doc = pd_deployment(str(vllm_model.path), NAME, mode="DryRun")
    doc["spec"]["vllm"]["kvLeaseSeconds"] = LEASE
    log = tmp_path_factory.mktemp("vllm-late") / "operator.log"
    with deployed(cluster, doc, "vllm-late", log) as pair:
        yield pair


def _step(prefill: str, n: int) -> None:
    """One ordinary request on the prefill: vLLM frees expired blocks and counts late
    notifications at the prefill's steps, and an idle engine takes none."""
    body = {"model": SERVED_NAME, "prompt": f"a step, number {n}", "max_tokens": 1}
    code, answer = http("POST", url(prefill, "/v1/completions"), body, timeout=60)
    assert code == 200, answer


def test_a_read_finished_after_its_lease_expired_is_announced_once(short_pair: VllmPD) -> None:
    prefill, decode = short_pair.ip("prefill"), short_pair.ip("decode")
    decode_uid = str(short_pair.pod("decode")["metadata"]["uid"])
    expired0, late0 = metric(prefill, EXPIRED), metric(prefill, LATE)
    body = {"model": SERVED_NAME, "prompt": "a decode step longer than the lease",
            "max_tokens": 4, "ignore_eos": True}  # fmt: skip
    first = {**body, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
    code, pre = http("POST", url(prefill, "/v1/completions"), first, timeout=120)
    assert code == 200 and isinstance(pre, dict) and pre.get("kv_transfer_params"), pre
    frozen = freeze_engine(decode_uid)
    t0 = time.monotonic()
    steps = 0
    try:
        leg, answer = decode_leg_in_background(decode, body, pre["kv_transfer_params"])

        def freed() -> bool:
            nonlocal steps
            steps += 1
            _step(prefill, steps)
            return metric(prefill, EXPIRED) > expired0

        short_pair.cluster.wait_until("the prefill freeing the unread KV", freed, timeout=120)
        print(f"[vllm] lease expired {time.monotonic() - t0:.0f}s into the decode's step",
              flush=True)  # fmt: skip
    finally:
        thaw(frozen)
    leg.join(120)
    assert answer, "the decode leg got no answer after the thaw"
    print(f"[vllm] the decode read the freed blocks and answered {answer[0]!r:.300}", flush=True)

    def counted() -> bool:
        nonlocal steps
        steps += 1
        _step(prefill, steps)
        return metric(prefill, LATE) > late0

    short_pair.cluster.wait_until("the prefill counting the late notification", counted, 120)
    name = str(short_pair.pod("prefill")["metadata"]["name"])

    def announced() -> list[str]:
        return [m for m in warnings(short_pair, "WedgeDetected")
                if m.startswith(f"LateNotification on {name}: ")]  # fmt: skip

    (message,) = short_pair.cluster.wait_until("the LateNotification Warning", announced, 60)
    print(f"[vllm] short lease -> {message}", flush=True)
    assert "following an expired KV lease" in message
    short_pair.operator.wait_cycles(2)  # one finding, one announcement
    assert len(announced()) == 1
