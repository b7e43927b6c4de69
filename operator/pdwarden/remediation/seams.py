"""The seams between the one remediation cycle and the kinds of object it runs for.

Why a module of its own, below the cycle: the cycle (`cycle`), the completion of a dead replica's
actions (`recovery`) and the two kinds (`kinds.deployment_kind`, `kinds.policy_kind`) all speak
these types; defining them here keeps every import pointing down. A `Kind` is what differs per kind
of object: which pods it covers (`observe`), what a cordon needs to be admitted (`admit`), how a
cordon and a restart land (`cordon`, `restart`), how to read back whether one landed (`applied`),
and where its status goes (`status`). Everything else is the cycle's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from pdwarden.api import HeldBack, LedgerEntry, PDDeploymentStatus, RemediationSpec
from pdwarden.ports import AdminApi, CanaryApi, KubeApi, PairCanaryApi, ScreenApi, WorkerApi
from pdwarden.remediation.act.done import Done
from pdwarden.remediation.act.sglang_abort import PrefillAborter
from pdwarden.remediation.decide import Plan, PlannedAction, PodState
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import DeploymentMemory, WorkerPod
from pdwarden.values import ScreenReport, Target

Obj = Mapping[str, Any]


@dataclass
class Seen:
    """What a kind found this cycle, in the cycle's terms."""

    namespace: str
    tenant: str  # the object's uid: its share of the scrape client
    pods: Sequence[Obj]  # every worker pod the kind covers, as the API server listed it
    workers: Sequence[WorkerPod]  # those that can be scraped now
    targets: Mapping[str, Target]  # by pod uid
    token: str | None  # pdworker's admin token (rooms list, FailRooms), when any pod has rooms
    unjudged: frozenset[str]  # covered pods that cannot be scraped now: never judged or acted on
    decode_replicas: int
    held: list[HeldBack] = field(default_factory=list)  # refusals this cycle (a PDB said no)
    # The admin token a rotation replaced, asked with when a worker refuses `token` (it has not
    # read its new one yet); None when nothing was rotated.
    fallback_token: str | None = None
    # Prometheus mode: how this cycle's screen judged the pods (its `Screened` condition).
    screen: ScreenReport | None = None

    def target(self, pod: str) -> Target | None:
        return next((t for t in self.targets.values() if t.pod == pod), None)

    def pod(self, name: str) -> Obj | None:
        return next((p for p in self.pods if (p.get("metadata") or {}).get("name") == name), None)

    def advised(self) -> Sequence[Obj]:
        """The pods whose settings this object reports (Advisories): every pod it covers."""
        return self.pods


class _Remediation(Protocol):
    @property
    def remediation(self) -> RemediationSpec: ...

    @property
    def engine(self) -> str: ...


SpecT = TypeVar("SpecT", bound=_Remediation)
Spec_contra = TypeVar("Spec_contra", bound=_Remediation, contravariant=True)
StatusT = TypeVar("StatusT")
SeenT = TypeVar("SeenT", bound=Seen)


class Kind(Protocol[Spec_contra, StatusT, SeenT]):
    """What one kind of object supplies to the cycle (remediation.kinds.*)."""

    name: str

    async def observe(self, body: Obj, spec: Spec_contra, mem: DeploymentMemory) -> SeenT: ...

    def serving(
        self, spec: Spec_contra, seen: SeenT, stale: set[str], history: Sequence[LedgerEntry],
        now: datetime,
    ) -> tuple[list[PodState], list[PodState]]: ...  # fmt: skip

    def admit(self, decision: Plan, seen: SeenT) -> Plan: ...

    async def cordon(
        self, spec: Spec_contra, seen: SeenT, action: PlannedAction, now: datetime
    ) -> Done: ...

    async def restart(
        self, spec: Spec_contra, seen: SeenT, action: PlannedAction, now: datetime
    ) -> Done: ...

    async def sglang_key(self, spec: Spec_contra, seen: SeenT) -> str | None: ...

    def applied(self, spec: Spec_contra, seen: SeenT, entry: LedgerEntry) -> bool | None: ...

    def reconstruct(
        self, seen: SeenT, history: Sequence[LedgerEntry], now: datetime
    ) -> list[LedgerEntry]: ...

    def shared_status(self, status: StatusT) -> PDDeploymentStatus: ...

    def status(
        self, previous: StatusT, spec: Spec_contra, seen: SeenT, *, detection: Detection,
        decision: Plan, history: Sequence[LedgerEntry], decodes: Sequence[PodState],
        done: Sequence[LedgerEntry], now: datetime, reset_at: datetime | None,
        generation: int | None, advisories: Sequence[PodAdvice],
    ) -> StatusT: ...  # fmt: skip


class Journal(Protocol):
    """Where intents go before actions: the object's status, one guarded write each."""

    async def intend(self, entry: LedgerEntry) -> None: ...


@dataclass
class Tools:
    """The process-wide clients a cycle acts through."""

    client: KubeApi
    workers: WorkerApi
    admin: AdminApi
    sglang: PrefillAborter
    canary: CanaryApi  # the confirm stage's one-token probe of a vLLM decode
    pair: PairCanaryApi | None = None  # the confirm stage's pair canary (None: none sent)
    screen: ScreenApi | None = None  # prometheus mode's screen (None: direct mode)


def now_utc() -> datetime:
    """The cycle's clock: whole seconds, as every time it writes (conditions, ledger) shows."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class Round(Generic[SpecT, StatusT, SeenT]):
    """One cycle of one object, as its acting half and `recovery` see it."""

    kind: Kind[SpecT, StatusT, SeenT]
    tools: Tools
    spec: SpecT
    seen: SeenT
    body: Obj
    now: datetime
    mem: DeploymentMemory
    journal: Journal
