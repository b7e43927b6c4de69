"""The operator's own Prometheus metrics (served by `pdwarden run --metrics-port`).

Why a module: metric objects are process-global in prometheus-client; defining them once here
keeps names stable and lets tests read them without starting a server.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "pdwarden_reconciles", "Reconcile passes by result (ok, invalid_spec, error).", ["result"]
)
RECONCILE_SECONDS = Histogram(
    "pdwarden_reconcile_seconds",
    "Wall time of one reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OBJECTS_APPLIED = Counter(
    "pdwarden_objects_applied", "Child objects written with server-side apply, by kind.", ["kind"]
)
STATUS_WRITES = Counter("pdwarden_status_writes", "Status patches of PDDeployments.")
MANAGED = Gauge("pdwarden_managed_deployments", "PDDeployments this operator reconciles.")
