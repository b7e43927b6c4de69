"""The operator's own Prometheus metrics (served by `pdwarden run --metrics-port`).

Why a module: metric objects are process-global in prometheus-client; defining them once here
keeps names stable and lets tests read them without starting a server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from pdwarden.values import CanaryVerdict, PairOutcome

# The label values the operator counts under. Declared at start (declare_series) so every
# series an alert or a dashboard panel reads exists at 0 before the first event: rate() and
# increase() then see the first one, and "no data" means the operator is not scraped.
RECONCILE_RESULTS = ("ok", "invalid_spec", "error")
REMEDIATION_RESULTS = ("succeeded", "failed", "skipped", "dry_run")
# scrape (one pod), canary (one canary on a vLLM decode), intent (the Pending entry before an
# action), action (one remediation action), event (posting an Event), cycle / policy_cycle (a
# whole remediation cycle), status_write, reconcile (a whole pass).
STAGES = (
    "scrape", "canary", "intent", "action", "event", "cycle", "policy_cycle", "status_write",
    "reconcile",
)  # fmt: skip
CANARY_VERDICTS: tuple[str, ...] = get_args(CanaryVerdict)  # alive, dead, unknown
PAIR_OUTCOMES: tuple[str, ...] = get_args(PairOutcome)

RECONCILES = Counter(
    "pdwarden_reconciles", "Reconcile passes by result (ok, invalid_spec, error).", ["result"]
)
RECONCILE_SECONDS = Histogram(
    "pdwarden_reconcile_seconds",
    "Wall time of one reconcile pass.",
    # Up to 2 min: on a busy API server a pass during create or rollout takes longer than 10 s
    # (bench/fleet.py measured its p99 above the old top bucket).
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
OBJECTS_APPLIED = Counter(
    "pdwarden_objects_applied", "Child objects written with server-side apply, by kind.", ["kind"]
)
STATUS_WRITES = Counter("pdwarden_status_writes", "Status patches of PDDeployments.")
STATUS_READS = Counter(
    "pdwarden_status_reads",
    "Objects read again because their resourceVersion could not be ordered against ours.",
)
MANAGED = Gauge("pdwarden_managed_deployments", "PDDeployments this operator reconciles.")

REMEDIATIONS = Counter(
    "pdwarden_remediations",
    "Remediation actions by action and result (succeeded, failed, skipped, dry_run).",
    ["action", "result"],
)
WEDGES_DETECTED = Counter(
    "pdwarden_wedges_detected", "New wedge findings (a pod and rule first seen wedged).", ["reason"]
)
SCRAPE_ERRORS = Counter(
    "pdwarden_scrape_errors", "Worker scrapes that failed or returned unusable metrics."
)
SCRAPES = Counter("pdwarden_scrapes", "Worker pods scraped (successfully or not).")
SCREEN_QUERIES = Counter(
    "pdwarden_screen_queries",
    "Prometheus screen queries (prometheus mode), by result: ok or error.",
    ["result"],
)
SCREEN_SECONDS = Histogram(
    "pdwarden_screen_seconds",
    "Wall time of one Prometheus screen query: the request, the read and the decoding.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
SCREENED = Counter(
    "pdwarden_screened_pods",
    "Worker pods judged from the Prometheus screen (prometheus mode), by how: screened, "
    "direct (a suspect, read directly) or unjudged (the screen could not tell).",
    ["how"],
)
SCRAPE_CYCLE_SECONDS = Histogram(
    "pdwarden_scrape_cycle_seconds",
    "Wall time of one scrape-detect-remediate cycle of one PDDeployment.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
TIME_TO_REMEDIATE = Histogram(
    "pdwarden_time_to_remediate_seconds",
    "Seconds from the first cycle that found a wedge (a finding on the pod, or naming it as the "
    "peer) to the repairing action on that pod succeeding; DryRun and held-back decisions are "
    "not observed.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
# Set by every remediation cycle, of both kinds (kind: PDDeployment or PDRemediationPolicy).
REMEDIATION_SUSPENDED = Gauge(
    "pdwarden_remediation_suspended",
    "1 while an object's circuit breaker holds remediation suspended, else 0.",
    ["kind", "namespace", "name"],
)
WEDGED_ROOMS = Gauge(
    "pdwarden_wedged_rooms",
    "Rooms wedged now (prefill findings), per PDDeployment or PDRemediationPolicy.",
    ["kind", "namespace", "name"],
)
# The confirm stage (remediation.confirm.canary): one per canary on a vLLM decode pod.
CANARIES = Counter(
    "pdwarden_canaries",
    "Canary generations on vLLM decode pods, by verdict (alive: a token came; dead: its API "
    "server answered and no token came in time; unknown: anything else).",
    ["verdict"],
)
# The confirm stage's pair canaries (remediation.confirm.pair_canary): their count is their cost.
PAIR_CANARIES = Counter(
    "pdwarden_pair_canaries",
    "Pair canaries sent through a prefill and a decode (one request of one output token each), "
    "by outcome (decoded; prefill_dead or decode_dead: that leg got no answer in time while the "
    "pod's counters stood still, canary.failureThreshold times in a row; suspect: the same, "
    "fewer times in a row so far; unknown: anything else).",
    ["outcome"],
)
CANARY_REQUESTS = Counter(
    "pdwarden_canary_requests",
    "Requests canaries made to worker pods, by kind (pair: one per leg sent; token: the "
    "one-token canary's model list and completion): what probing costs the pods.",
    ["kind"],
)
CANARY_WAIT_SECONDS = Counter(
    "pdwarden_canary_wait_seconds",
    "Seconds remediation cycles waited on canary answers, by kind (pair, token): what probing "
    "costs the operator (a cycle holds its object's lock while it waits).",
    ["kind"],
)
PAIR_CANARY_SECONDS = Histogram(
    "pdwarden_pair_canary_seconds",
    "Seconds a pair canary took from the prefill leg to the decode's token, when both answered.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
)
SCRAPE_REFUSED = Counter(
    "pdwarden_scrape_refused",
    "Pods whose /metrics answer went over the byte cap (counted when first seen).",
)

# Every error the shells contained instead of letting it kill a handler, by where it happened
# (STAGES).
ERRORS = Counter(
    "pdwarden_operator_errors",
    "Errors contained by the operator (a pod, an action, a cycle or a pass), by stage.",
    ["stage"],
)
STATUS_CONFLICTS = Counter(
    "pdwarden_status_conflicts",
    "Status writes refused because the object changed meanwhile (then merged and retried).",
)
# Per-deployment progress counters: a test (or a person) can wait for N more cycles and then
# assert that nothing happened, instead of sleeping.
REMEDIATION_CYCLES = Counter(
    "pdwarden_remediation_cycles",
    "Remediation cycles finished (whatever their outcome), per PDDeployment.",
    ["namespace", "name"],
)
RECONCILE_PASSES = Counter(
    "pdwarden_reconcile_passes",
    "Reconcile passes finished (whatever their outcome), per PDDeployment.",
    ["namespace", "name"],
)
PER_DEPLOYMENT = (REMEDIATION_CYCLES, RECONCILE_PASSES)  # by namespace, name
PER_OBJECT = (REMEDIATION_SUSPENDED, WEDGED_ROOMS)  # by kind, namespace, name
POLICY_CYCLES = Counter(
    "pdwarden_policy_cycles",
    "Remediation cycles finished (whatever their outcome), per PDRemediationPolicy.",
    ["namespace", "name"],
)


def declare_series(actions: Iterable[str], reasons: Iterable[str]) -> None:
    """Create every labelled counter series at 0 (called once at start; idempotent)."""
    for result in RECONCILE_RESULTS:
        RECONCILES.labels(result)
    for action in actions:
        for result in REMEDIATION_RESULTS:
            REMEDIATIONS.labels(action, result)
    for reason in reasons:
        WEDGES_DETECTED.labels(reason)
    for stage in STAGES:
        ERRORS.labels(stage)
    for verdict in CANARY_VERDICTS:
        CANARIES.labels(verdict)
    for outcome in PAIR_OUTCOMES:
        PAIR_CANARIES.labels(outcome)
    for kind in ("pair", "token"):
        CANARY_REQUESTS.labels(kind)
        CANARY_WAIT_SECONDS.labels(kind)
