"""The worker's public contract: metric names, admin API shapes, fault switches, KVPoll, and
the KV notification codec that prefill and decode both speak.

This is the only pdworker module the operator may import (enforced by import-linter), so it
stays dependency-free: no torch, no NIXL, no aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final


class KVPoll(IntEnum):
    """Per-room transfer state; the ints match SGLang's KVPoll."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# Prometheus metric names (docs/engines.md shows them). prometheus-client appends `_total`
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
PREFILL_FORWARD_SECONDS: Final = "pdworker_prefill_forward_seconds"  # extension (issue 16)
KV_CHECKSUM_MISMATCH: Final = "pdworker_kv_checksum_mismatch_total"
INCARNATION_INFO: Final = "pdworker_incarnation_info"
# Extensions (issue 26): what hostile clients cost a worker, by reason.
HTTP_CONNECTIONS_CLOSED: Final = "pdworker_http_connections_closed_total"
HTTP_CLOSE_REASONS: Final = ("evicted", "connection_cap", "head_timeout")
PREFILL_ENDPOINTS_REFUSED: Final = "pdworker_decode_prefill_endpoints_refused_total"
ENDPOINT_REFUSE_REASONS: Final = ("not_allowed", "unreachable", "untrusted", "refused", "layout")

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

# Bootstrap (handshake) authentication: a per-deployment key, separate from the admin token.
BOOTSTRAP_TOKEN_FILE_ENV: Final = "PDWORKER_BOOTSTRAP_TOKEN_FILE"

# GET /admin/rooms answers {ROOMS_KEY: [room, ...]}, each room a JSON object with these keys;
# POST /admin/rooms/fail answers {FAILED_KEY: [room id, ...]} (the rooms it failed now).
ROOMS_KEY: Final = "rooms"
FAILED_KEY: Final = "failed"
ROOM_ID: Final = "room"
ROOM_PHASE: Final = "phase"
ROOM_PHASE_SECONDS: Final = "phase_seconds"
ROOM_PEER: Final = "peer"
ROOM_PEER_INCARNATION: Final = "incarnation"

# GET /admin/rooms `peer` fields. Only `ip` was verified by the prefill (the TCP peer address of
# an authenticated bootstrap call, from a caller holding this deployment's bootstrap key); `pod`
# is the peer's own unverified claim, a hint for people. Whoever acts on a peer maps `ip` to a
# pod of the same deployment itself.
ROOM_PEER_VERIFIED_IP: Final = "ip"
ROOM_PEER_POD_HINT: Final = "pod"


# -- KV notifications (prefill -> decode over NIXL) ------------------------------------------
# `kv:<room>:<chunk>` after each chunk's WRITE, `meta:<room>:<chunks>:<first token>:<checksum>`
# once all chunks are written, `fail:<room>:<reason>` when prefill failed the room.
MAX_NOTIFICATION_BYTES: Final = 256
_MAX_ROOM = 2**63


@dataclass(frozen=True)
class KVChunk:
    room: int
    index: int


@dataclass(frozen=True)
class KVMeta:
    room: int
    chunks: int
    first_token: int
    checksum: str


@dataclass(frozen=True)
class KVFail:
    room: int
    reason: str


Notification = KVChunk | KVMeta | KVFail


def _checksum_ok(value: str) -> bool:
    # An integrity fingerprint such as `sample.8.12345.00ab...` (pdworker.integrity): ASCII
    # letters, digits and dots, never the `:` that separates the fields.
    return 0 < len(value) <= 128 and value.isascii() and value.replace(".", "").isalnum()


def encode_notification(note: Notification) -> bytes:
    """The wire form of a notification; ValueError for values the decoder would refuse."""
    if not 0 <= note.room < _MAX_ROOM:
        raise ValueError(f"room out of range: {note.room}")
    if isinstance(note, KVChunk):
        if note.index < 0:
            raise ValueError("chunk index must be >= 0")
        return f"kv:{note.room}:{note.index}".encode()
    if isinstance(note, KVMeta):
        if note.chunks < 1 or note.first_token < 0 or not _checksum_ok(note.checksum):
            raise ValueError(f"bad meta notification {note!r}")
        return f"meta:{note.room}:{note.chunks}:{note.first_token}:{note.checksum}".encode()
    if note.reason not in FAILURE_REASONS:
        raise ValueError(f"unknown failure reason {note.reason!r}")
    return f"fail:{note.room}:{note.reason}".encode()


def _natural(text: str, limit: int = 2**63) -> int | None:
    """A decimal of ASCII digits only (no sign, no '²', no spaces) below `limit`, else None."""
    if not text or len(text) > 19 or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value < limit else None


def decode_notification(raw: bytes) -> Notification | None:
    """Parse a notification; None for anything malformed (never raises on any input).

    A `fail` with a reason this version does not know decodes as `transfer_error`.
    """
    if len(raw) > MAX_NOTIFICATION_BYTES:
        return None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    kind, _, rest = text.partition(":")
    fields = rest.split(":")
    room = _natural(fields[0])
    if room is None:
        return None
    if kind == "kv" and len(fields) == 2:
        index = _natural(fields[1])
        return None if index is None else KVChunk(room, index)
    if kind == "meta" and len(fields) == 4:
        chunks, first = _natural(fields[1]), _natural(fields[2])
        if chunks is None or chunks < 1 or first is None or not _checksum_ok(fields[3]):
            return None
        return KVMeta(room, chunks, first, fields[3])
    if kind == "fail" and len(fields) == 2:
        reason = fields[1] if fields[1] in FAILURE_REASONS else "transfer_error"
        return KVFail(room, reason)
    return None
