"""The plain values the operator's seams carry, at the bottom of the house.

Why here: `ports` (the Protocols every shell depends on) speaks these types, and the adapters that
produce them (`remediation.scrape`, `k8s.foreign`) sit above it. Defining them below both keeps
every import pointing down: a port never imports the stage that implements it. Nothing here does
I/O or knows an engine; `remediation.scrape.samples` builds Samples, `k8s.foreign` builds
EvictionOutcomes, `remediation.act` builds LabelPatches, `remediation.confirm` CanaryResults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pdwarden.constants import WORKER_PORT
from pdworker.contract import METRICS_PATH


@dataclass(frozen=True)
class Target:
    """One pod to scrape or act on over HTTP: where it listens and what to read from it."""

    pod: str
    uid: str
    role: str
    ip: str
    port: int = WORKER_PORT
    rooms: bool = False  # also read GET /admin/rooms (pdworker prefill)
    engine: str | None = None  # picks the metrics adapter; None reads either engine's names
    metrics_path: str = METRICS_PATH  # a PDRemediationPolicy names its own (spec.metrics)
    scheme: str = "http"
    # An SGLang prefill's bootstrap server (read from its command line): where the decode leg of
    # the pair canary's KV request asks for the room; 0 = none known (no KV request is sent).
    bootstrap_port: int = 0

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.ip}:{self.port}"


@dataclass(frozen=True)
class Sample:
    """A worker's queue state at one moment. None = the engine does not report that metric.

    Counters (`engines.COUNTER_FIELDS`) are compared between samples: any change is
    movement. `generated_tokens` is only ever fed by a counter that moves on every decode step.
    """

    at: float
    bootstrap_queue: float | None = None
    inflight_queue: float | None = None
    inflight_oldest_seconds: float | None = None
    prealloc_queue: float | None = None
    transfer_queue: float | None = None
    running: float | None = None
    generated_tokens: float | None = None
    throughput: float | None = None
    completed: float | None = None
    failed: float | None = None
    incarnation: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    waiting_queue: float | None = None  # requests waiting for a forward pass
    prefill_tokens: float | None = None  # prompt tokens computed (moves per prefill step)
    kv_transfers: float | None = None  # rooms whose KV transfer finished (sent or received)
    # Engines whose decode pulls KV (vLLM): reads this decode posted and waits on the prefill for.
    reading_queue: float | None = None
    # vLLM prefill (engines/vllm.py): requests whose blocks' lease expired before a decode
    # read them, and read-done notifications that came after such an expiry (possible corrupted KV).
    kv_expired: float | None = None
    late_notifications: float | None = None
    # vLLM decode: prompt tokens it computed itself, and those whose KV arrived from a prefill
    # (`vllm:prompt_tokens_by_source`): with kv_load_failure_policy recompute, a failed read is
    # recomputed on the decode and the client never sees it.
    recomputed_tokens: float | None = None
    transferred_tokens: float | None = None

    def queue(self, name: str) -> float:
        value = getattr(self, name)
        return float(value) if value is not None else 0.0


@dataclass(frozen=True)
class RoomView:
    """One live room as a pdworker prefill's admin API reports it."""

    room: int
    phase: str
    phase_seconds: float
    peer_pod: str | None  # the peer's own word until the shell attributes it by verified IP
    peer_incarnation: str | None
    peer_ip: str | None = None  # the address the prefill verified the peer's handshake from


@dataclass(frozen=True)
class ScrapeResult:
    """What one scrape of one pod returned: a sample (and rooms), or why not."""

    target: Target
    sample: Sample | None = None
    rooms: tuple[RoomView, ...] | None = None
    error: str | None = None
    # Why the body was refused, when it was: "too_large" (over the byte cap: the pod is not
    # judged, and the owner object says so) or "" for every other error.
    refused: str = ""
    # The admin API refused the token (401/403): after a token rotation the worker may not
    # have read its new one yet, and the cycle asks again with the one it replaced.
    auth_refused: bool = False


@dataclass(frozen=True)
class Screened:
    """One pod as Prometheus's screen saw it (prometheus mode, `remediation.scrape.screen`): a
    sample, or why the pod is read directly instead (`direct`), or why it cannot be judged at
    all (`missing`: never acted on while it lasts)."""

    sample: Sample | None = None
    direct: str = ""
    missing: str = ""


@dataclass(frozen=True)
class ScreenView:
    """What one screen says of one object's pods: by pod uid, or why none (`error`: Prometheus
    down, slow, or answering garbage or too much)."""

    pods: Mapping[str, Screened] = field(default_factory=dict)
    error: str = ""
    source: str = ""  # where it came from, for a condition's message (Prometheus's URL)


@dataclass(frozen=True)
class ScreenReport:
    """How one cycle of one object judged its pods in prometheus mode (its `Screened`
    condition): how many the screen judged, how many were read directly, and which ones the
    screen could not tell about (never acted on), or why it told nothing at all."""

    source: str
    pods: int
    screened: int = 0
    direct: int = 0
    missing: Mapping[str, str] = field(default_factory=dict)  # pod name -> why
    error: str = ""


@dataclass(frozen=True)
class LabelPatch:
    """Set one label on one pod incarnation (guarded by uid and resourceVersion)."""

    pod: str
    uid: str
    resource_version: str
    key: str
    value: str


EvictionResult = Literal["Evicted", "HeldBack", "Gone", "Failed"]


@dataclass(frozen=True)
class EvictionOutcome:
    """How the Eviction API answered: evicted, held back by a PodDisruptionBudget, gone."""

    result: EvictionResult
    reason: str


CanaryVerdict = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True)
class CanaryCost:
    """What canaries cost one object in one cycle (or, summed, since counting began): canaries
    sent (pair and one-token), the requests they made to pods (a pair canary: one per leg sent;
    a one-token canary: its model list and its completion), and the seconds the cycle waited
    on their answers."""

    sent: int = 0
    requests: int = 0
    seconds: float = 0.0

    def __add__(self, other: CanaryCost) -> CanaryCost:
        return CanaryCost(
            self.sent + other.sent, self.requests + other.requests, self.seconds + other.seconds
        )


@dataclass(frozen=True)
class CanaryResult:
    """What one canary generation on a decode pod found (`remediation.confirm.canary`).

    alive: it answered with a token. dead: its API server answered and the generation did not
    within the deadline (the engine is frozen behind it). unknown: anything else, which proves
    nothing either way. `detail` is our own words (never the server's) for the ledger reason,
    the finding's evidence and the log.
    """

    pod: str
    verdict: CanaryVerdict
    detail: str


PairOutcome = Literal["decoded", "alive", "prefill_dead", "decode_dead", "suspect", "unknown"]
# How a pair canary asks (`PairCanary.protocol`): "pd" sends one request through the prefill and
# then the decode (the KV moves); "health" asks both sides' own health checks at once, for an
# engine whose two PD legs wait on each other, so that a leg without an answer names no side (and,
# with `PairCanary.kv_path`, one PD request to both sides beside them: the KV moves too).
PairProtocol = Literal["pd", "health"]


@dataclass(frozen=True)
class PairResult:
    """What one pair canary found (`remediation.confirm.pair_canary`): decoded (the prefill
    answered, the decode pulled the KV and answered, in `seconds`; with the "health" protocol,
    both sides' health checks answered too); alive (the "health" protocol: both sides' own
    health checks answered, in `seconds`, and no KV request completed: `detail` says why);
    prefill_dead or decode_dead
    (that leg got no answer within the deadline while the pod's own counters stood still);
    suspect (such a dead leg, but fewer times in a row than canary.failureThreshold: judged by
    `decide.pairs.judged`, never by the sender); or unknown (anything else: it proves nothing).
    `detail` is our own words."""

    prefill: str
    decode: str
    outcome: PairOutcome
    detail: str
    seconds: float = 0.0
    # Which legs were answered (a side that answered is alive: `decide.pairs.judged`) and which
    # were sent (what the canary may have added to each pod's counters: `memory.organic`; a
    # slow engine processes a leg whose deadline ran out all the same).
    prefill_answered: bool = False
    decode_answered: bool = False
    prefill_sent: bool = False
    decode_sent: bool = False
    kv_sent: bool = False  # the "health" protocol's KV request went out (it owes `effects`)


@dataclass(frozen=True)
class PairCanary:
    """One engine's pair canary: a request of one output token sent through a prefill and then
    a decode the way the engine's own router sends it, so the KV really moves between them
    (remediation/confirm/pair_canary.py sends it). The prompt is token ids, so what one canary
    adds to each counter is known exactly (`effects`): detection subtracts it, and a canary
    never reads as progress."""

    prefill_fields: Mapping[str, Any]  # merged into the prefill leg (vLLM: kv_transfer_params)
    carried: str  # the field of the prefill's answer the decode leg carries on
    effects: Mapping[str, Mapping[str, float]]  # role -> Sample counter -> added by one canary
    prompt: tuple[int, ...] = (1, 2, 3, 4)
    models_path: str = "/v1/models"
    path: str = "/v1/completions"  # "pd": the legs' path; "health": the health check's (GET)
    protocol: PairProtocol = "pd"
    # "health" only: where one PD request goes to both sides at once beside the health checks
    # ("" = none), its body `kv_fields` plus the prompt and the prefill's bootstrap address
    # (`kv_body`); `effects` is what that request adds (health checks add nothing read).
    kv_path: str = ""
    kv_fields: Mapping[str, Any] = field(default_factory=dict)
    # What a KV request that did not complete may add instead of `effects` (role -> counter ->
    # amount): a failed transfer is no user's failure either.
    failed_effects: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def kv_body(self, host: str, port: int, room: int) -> dict[str, Any]:
        """The KV request both sides get: SGLang's PD protocol (the router's: the same body to
        prefill and decode, the prefill's bootstrap host, port and a room number)."""
        return {**self.kv_fields, "input_ids": list(self.prompt), "bootstrap_host": host,
                "bootstrap_port": port, "bootstrap_room": room}  # fmt: skip

    def prefill_body(self, model: str) -> dict[str, Any]:
        return {"model": model, "prompt": list(self.prompt), "max_tokens": 1, "stream": False,
                **self.prefill_fields}  # fmt: skip

    def decode_body(self, model: str, answer: Any) -> dict[str, Any] | None:
        """The decode leg, or None when the prefill's answer lacks what it must carry."""
        carried = answer.get(self.carried) if isinstance(answer, dict) else None
        if not isinstance(carried, dict) or not carried:
            return None
        return {"model": model, "prompt": list(self.prompt), "max_tokens": 1, "stream": False,
                self.carried: carried}  # fmt: skip
