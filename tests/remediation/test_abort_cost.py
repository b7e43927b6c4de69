"""What one abort_all on a stock SGLang prefill cost, counted from its queue gauges (issue 25).

On a PD prefill `num_running_reqs` is the last forward batch, published after that batch's
finished requests were appended to the inflight queue (sglang 0.5.23 disaggregation/prefill.py:
1034 then :1142; metrics_reporter.py:851-858): adding it counts them twice.
"""

from __future__ import annotations

from pdwarden.remediation.act.abort_cost import AbortCost, PrefillQueues, abort_all_cost


def test_the_running_gauge_is_not_counted_twice() -> None:
    """A wedged prefill probed by /health: the gauges were last published at the probe's
    batch (running 1, the probe inflight with the 3 wedged rooms). The finding counted the
    same gauge, so nothing healthy was lost."""
    q = PrefillQueues(running=1, waiting=0, bootstrap=0, inflight=4)
    cost = abort_all_cost(q, wedged=4)
    assert (cost.aborted, cost.wedged, cost.healthy, cost.healthy_at_least) == (4, 4, 0, 0)
    assert cost.describe(q) == (
        "aborted 4 requests: 4 wedged, 0 healthy (gauges just before: waiting 0, bootstrap 0, "
        "inflight 4; the running gauge (1) is the last forward batch, already counted inflight, "
        "and any /health probe in it had already left)"
    )


def test_a_probe_phantom_is_not_called_healthy_for_sure() -> None:
    """The finding's minimum predates the first probe (3 wedged); the gauge read before the
    abort counts the probe that already left (4): one healthy at most, maybe none."""
    q = PrefillQueues(running=1, waiting=0, bootstrap=0, inflight=4)
    cost = abort_all_cost(q, wedged=3)
    assert (cost.aborted, cost.healthy, cost.healthy_at_least) == (4, 1, 0)
    assert cost.describe(q).startswith("aborted 4 requests: 3 wedged, 0-1 healthy (")


def test_a_loaded_prefill_loses_its_healthy_requests_too() -> None:
    q = PrefillQueues(running=2, waiting=3, bootstrap=1, inflight=6)
    cost = abort_all_cost(q, wedged=3)
    assert (cost.aborted, cost.healthy, cost.healthy_at_least) == (3 + 1 + 6, 7, 5)
    assert cost.describe(q).startswith("aborted 10 requests: 3 wedged, 5-7 healthy (")


def test_unreadable_gauges_say_so() -> None:
    cost = abort_all_cost(None, wedged=3)
    assert cost == AbortCost(aborted=0, wedged=3, known=False)
    assert "count unknown" in cost.describe(PrefillQueues())
    assert not abort_all_cost(PrefillQueues(running=5), 1).known  # running alone says nothing


def test_a_queue_the_pod_does_not_report_reads_as_unknown_not_zero() -> None:
    q = PrefillQueues(waiting=2, inflight=3)
    cost = abort_all_cost(q, wedged=9)
    assert (cost.aborted, cost.wedged, cost.healthy) == (5, 5, 0)  # never more wedged than held
    assert "bootstrap unknown" in cost.describe(q)
