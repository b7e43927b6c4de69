"""The worker's public contract: metric names, admin API shapes, fault switches, KVPoll.

This is the only pdworker module the operator may import (enforced by import-linter), so it
stays dependency-free: no torch, no NIXL, no aiohttp.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class KVPoll(IntEnum):
    """Per-room transfer state; the ints match SGLang's KVPoll."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# Prometheus metric names (ARCHITECTURE.md section 5). prometheus-client appends `_total`
# to counters itself, so the *_BASE names are what the worker registers.
PREFILL_BOOTSTRAP_QUEUE: Final = "pdworker_prefill_bootstrap_queue_reqs"
PREFILL_INFLIGHT_QUEUE: Final = "pdworker_prefill_inflight_queue_reqs"
PREFILL_INFLIGHT_OLDEST: Final = "pdworker_prefill_inflight_oldest_seconds"
DECODE_PREALLOC_QUEUE: Final = "pdworker_decode_prealloc_queue_reqs"
DECODE_TRANSFER_QUEUE: Final = "pdworker_decode_transfer_queue_reqs"
DECODE_RUNNING: Final = "pdworker_decode_running_reqs"
GENERATED_TOKENS: Final = "pdworker_generated_tokens_total"
REQUESTS_COMPLETED: Final = "pdworker_requests_completed_total"
REQUESTS_FAILED: Final = "pdworker_requests_failed_total"
KV_TRANSFER_BYTES: Final = "pdworker_kv_transfer_bytes_total"
KV_TRANSFER_SECONDS: Final = "pdworker_kv_transfer_seconds"
KV_CHECKSUM_MISMATCH: Final = "pdworker_kv_checksum_mismatch_total"
INCARNATION_INFO: Final = "pdworker_incarnation_info"

# Values of the `reason` label of REQUESTS_FAILED.
FAILURE_REASONS: Final = (
    "aborted",
    "bootstrap_timeout",
    "waiting_timeout",
    "inflight_timeout",
    "transfer_error",
    "peer_lost",
    "admin",
)

# Admin API (token-protected; `Authorization: Bearer <token>`).
ADMIN_ROOMS_PATH: Final = "/admin/rooms"
ADMIN_ROOMS_FAIL_PATH: Final = "/admin/rooms/fail"
METRICS_PATH: Final = "/metrics"
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"

# Fault switches (`--fault` / PDWORKER_FAULTS, comma separated; drop-notifications=P takes a value).
FAULT_LEGACY_STATUS_RACE: Final = "legacy-status-race"
FAULT_NO_INFLIGHT_WATCHDOG: Final = "no-inflight-watchdog"
FAULT_DECODE_STALL: Final = "decode-stall"
FAULT_DROP_NOTIFICATIONS: Final = "drop-notifications"
FAULT_CORRUPT_KV: Final = "corrupt-kv"  # decode flips one byte of a landed page, probability P
FAULTS: Final = (
    FAULT_LEGACY_STATUS_RACE,
    FAULT_NO_INFLIGHT_WATCHDOG,
    FAULT_DECODE_STALL,
    FAULT_DROP_NOTIFICATIONS,
    FAULT_CORRUPT_KV,
)
FAULTS_ENV: Final = "PDWORKER_FAULTS"
ADMIN_TOKEN_FILE_ENV: Final = "PDWORKER_ADMIN_TOKEN_FILE"

# Decode-stall trigger (extension of the admin API; token-protected like the rest).
ADMIN_DECODE_STALL_PATH: Final = "/admin/decode-stall"

# Default ports: every pod has its own loopback/pod IP, so the same ports are used everywhere.
DEFAULT_HTTP_PORT: Final = 8000
DEFAULT_BOOTSTRAP_PORT: Final = 8998

# Room phases reported by GET /admin/rooms (`phase`), per role.
PREFILL_PHASES: Final = ("bootstrap", "forward", "inflight")
DECODE_PHASES: Final = ("prealloc", "transfer", "running")

# Extra worker gauges (not used by detection; tests use them to prove nothing leaks).
KV_PAGES_FREE: Final = "pdworker_kv_pages_free"
KV_PAGES_TOTAL: Final = "pdworker_kv_pages_total"
