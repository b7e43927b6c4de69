"""What one `abort_all` on a stock SGLang prefill costs, counted from its queue gauges.

Why its own module: SGLang 0.5.23 offers an operator nothing narrower than aborting every request of
a prefill (see `act.sglang_abort`), so the ledger and the Event must say how many healthy requests
that cost, and the count must not be inflated. Pure arithmetic over the gauge values read just
before the call; the reading itself is the scrape's.

What `abort_all` drops on a prefill (managers/scheduler.py:5675-5812): the waiting queue
(:5685-5722), the bootstrap queue (:5742-5751), the inflight queue (:5753-5758), the prompt being
chunked (:5676-5678) and the running batches (:5797-5812). Their gauges:

* `num_queue_reqs`, `num_prefill_bootstrap_queue_reqs`, `num_prefill_inflight_queue_reqs`: each
  request once.
* `num_running_reqs` is NOT added: on a PD prefill `running_batch` is never filled and the gauge
  holds the last forward batch (managers/scheduler_components/metrics_reporter.py:851-858),
  published after that batch's finished requests were appended to the inflight queue
  (disaggregation/prefill.py:1034, then `report_prefill_stats` at :1142). They are already in
  the inflight count. (A prompt still being chunked is in the batch but not yet inflight: at
  most one per DP rank, which this count leaves out.)
* A wedged prefill is not "fully idle", so SGLang republishes its gauges only at the next batch
  (managers/scheduler.py:5241-5272): a health-check probe is such a batch, and the inflight
  gauge then still counts the probe, which left at once (its fake transfer succeeds). Such a
  phantom is part of the last batch, so at most `running` of the inflight count are phantoms
  (one per DP rank whose last batch was a probe). Nothing in the gauges says whether the last
  batch was probes or real requests (under load it is real requests, still inflight), so the
  count aborted is the gauge total and the healthy count is given as a range when the two
  readings differ: at most aborted - wedged, at least that minus the last batch. The finding's
  wedged count is the minimum over its window, which may predate the first probe (the e2e
  reads 4 aborted for 3 wedged rooms on a probed two-rank prefill: "0-1 healthy").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillQueues:
    """An SGLang prefill's queue gauges at one moment (DP ranks summed, the priority="" total);
    None = not reported."""

    running: float | None = None
    waiting: float | None = None
    bootstrap: float | None = None
    inflight: float | None = None

    @property
    def known(self) -> bool:
        return any(v is not None for v in (self.waiting, self.bootstrap, self.inflight))


@dataclass(frozen=True)
class AbortCost:
    aborted: int  # requests the prefill held just before the call (0 when unknown)
    wedged: int  # of which wedged rooms, as the finding counted them
    known: bool
    last_batch: int = 0  # of `aborted`, how many may be /health probes that already left

    @property
    def healthy(self) -> int:
        """Requests that were not part of the wedge and were aborted with it (at most)."""
        return max(0, self.aborted - self.wedged)

    @property
    def healthy_at_least(self) -> int:
        """The same, if the whole last batch was health-check probes (already gone)."""
        return max(0, self.healthy - self.last_batch)

    def _healthy_words(self) -> str:
        low, high = self.healthy_at_least, self.healthy
        return f"{high} healthy" if low == high else f"{low}-{high} healthy"

    def describe(self, queues: PrefillQueues) -> str:
        """The counts first (the ledger reason and the Event lead with them), then the gauges
        they came from."""
        if not self.known:
            return "aborted every request it held (queue gauges unreadable, count unknown)"
        parts = ", ".join(
            f"{name} {value:g}" if value is not None else f"{name} unknown"
            for name, value in (
                ("waiting", queues.waiting),
                ("bootstrap", queues.bootstrap),
                ("inflight", queues.inflight),
            )
        )
        running = (
            f"; the running gauge ({queues.running:g}) is the last forward batch, already "
            "counted inflight, and any /health probe in it had already left"
            if queues.running
            else ""
        )
        return (
            f"aborted {self.aborted} requests: {self.wedged} wedged, {self._healthy_words()} "
            f"(gauges just before: {parts}{running})"
        )


def abort_all_cost(queues: PrefillQueues | None, wedged: int) -> AbortCost:
    """The requests one abort_all drops, from the gauges read just before it, and how many of
    them were healthy given the finding's `wedged` room count."""
    if queues is None or not queues.known:
        return AbortCost(aborted=0, wedged=max(0, wedged), known=False)
    held = sum(int(v or 0) for v in (queues.waiting, queues.bootstrap, queues.inflight))
    last_batch = min(int(queues.running or 0), int(queues.inflight or 0))
    return AbortCost(
        aborted=held, wedged=min(max(0, wedged), held), known=True, last_batch=max(0, last_batch)
    )
