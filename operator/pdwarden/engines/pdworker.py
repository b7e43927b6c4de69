"""pdworker, pdwarden's reference KV-transfer worker: its pods, its series, its repair ladder.

Why pdworker is an engine like the others: it is what `make demo` and most tests run, and it is
the only engine with a rooms API (list the prefill's rooms, fail them by id), so its ladder can
start with the narrowest repair there is: FailRooms.

A pdworker decode dials only its own deployment's prefill pods: it gets `--prefill-selector`
with the labels of those pods, lists them (in its namespace, $POD_NAMESPACE) with the
deployment's discovery ServiceAccount (the router's: pods get/list/watch, nothing else) and
refuses, before connecting, any bootstrap endpoint that is not one of them at the port it
declares as `bootstrap` (pdworker/allow.py). Pod IPs are not known when a template is rendered,
so a list rendered here could not name them; the selector is what is known, and the decode
enforces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pdwarden.api import PDDeploymentSpec
from pdwarden.constants import (
    ADMIN_TOKEN_DIR,
    ADMIN_TOKEN_KEY,
    BOOTSTRAP_TOKEN_DIR,
    ROLE_DECODE,
    ROLE_PREFILL,
    WORKER_PORT,
)
from pdwarden.engines.launch import Launch
from pdwarden.engines.protocol import (
    Advice,
    AdviceRule,
    MetricTable,
    Obj,
    PrefillRung,
    ProbeMoved,
    Series,
)
from pdwarden.ownership import selector
from pdwarden.values import PairCanary
from pdworker import contract as pdw

METRICS: Final = MetricTable(
    "pdworker",
    (
        Series(pdw.PREFILL_BOOTSTRAP_QUEUE, "bootstrap_queue"),
        Series(pdw.PREFILL_INFLIGHT_QUEUE, "inflight_queue"),
        Series(pdw.PREFILL_INFLIGHT_OLDEST, "inflight_oldest_seconds"),
        Series(pdw.DECODE_PREALLOC_QUEUE, "prealloc_queue"),
        Series(pdw.DECODE_TRANSFER_QUEUE, "transfer_queue"),
        Series(pdw.DECODE_RUNNING, "running"),
        # pdworker's token counter moves on every generated token: a valid progress signal.
        Series(pdw.GENERATED_TOKENS, "generated_tokens"),
        Series(pdw.REQUESTS_COMPLETED, "completed", sum_over=("role",)),
        Series(pdw.REQUESTS_FAILED, "failed", sum_over=("reason",)),
        # Observed per room when its KV transfer finished: sent on prefill, received on decode.
        Series(pdw.KV_TRANSFER_SECONDS + "_count", "kv_transfers"),
    ),
)


@dataclass(frozen=True)
class PDWorker:
    name: str = "pdworker"
    metrics: MetricTable = METRICS
    probe_moved: tuple[ProbeMoved, ...] = ()  # its probes (/healthz, /readyz) generate nothing
    rooms_api: bool = True
    always_routed: bool = True  # its router is how requests reach a PD pair
    bootstrap_key: bool = True
    decode_lists_prefills: bool = True
    canary_confirms_decodes: bool = False  # a stalled decode shows on its own gauges
    pair_canary: PairCanary | None = None
    prefill_rungs: Mapping[str, PrefillRung] = field(
        default_factory=lambda: {"InflightStuck": "fail_rooms", "PeerIncarnationGone": "fail_rooms"}
    )
    # pdwarden's own worker: its deadlines are pdwarden's, and nothing a pod sets turns them off.
    advisory_rules: tuple[AdviceRule, ...] = ()

    def worker_launch(self, spec: PDDeploymentSpec, role: str, deployment: str) -> Launch:
        pool = spec.prefill if role == ROLE_PREFILL else spec.decode
        # POD_IP, POD_NAME and POD_NAMESPACE reach pdworker as environment defaults (pods.py).
        command = ["pdworker", role, "--port", str(WORKER_PORT)]
        if role == ROLE_PREFILL:
            command += ["--bootstrap-port", str(spec.transfer.bootstrap_port)]
        else:  # the only prefills this decode may dial (module docstring)
            command += ["--prefill-selector", selector(deployment, ROLE_PREFILL)]
        env = {pdw.BOOTSTRAP_TOKEN_FILE_ENV: f"{BOOTSTRAP_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"}
        if self.needs_admin_token(spec, role):
            env[pdw.ADMIN_TOKEN_FILE_ENV] = f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"
        return Launch(command=[*command, *pool.args], env=env)

    def needs_admin_token(self, spec: PDDeploymentSpec, role: str) -> bool:
        """Only what a role uses: the operator calls prefill's admin API; decode's is used only
        to trigger the decode-stall fault on purpose, so only a decode with that fault armed
        gets it."""
        if role == ROLE_PREFILL:
            return True
        if role != ROLE_DECODE:
            return False
        faults = [e.value or "" for e in spec.decode.env if e.name == pdw.FAULTS_ENV]
        return any(pdw.FAULT_DECODE_STALL in text for text in [*faults, *spec.decode.args])

    def router_launch(self, spec: PDDeploymentSpec, deployment: str, namespace: str) -> Launch:
        return Launch(command=pdworker_router(spec, deployment, namespace))

    def rooms_wait_for_decode_kv(self, pod: Obj, role: str) -> bool:
        return True  # judged by its rooms API, not by this excuse

    def bootstrap_port(self, pod: Obj, role: str) -> int:
        return 0  # no pair canary

    def advisories(self, pod: Obj) -> tuple[Advice, ...]:
        return ()


def pdworker_router(
    spec: PDDeploymentSpec, deployment: str, namespace: str, *mode: str
) -> list[str]:
    """pdworker's router command line (`mode`: extra flags, e.g. vLLM's two-leg protocol)."""
    return [
        "pdworker", "router",
        "--host", "$(POD_IP)",
        "--port", str(WORKER_PORT),
        "--discovery", "kubernetes",
        "--namespace", namespace,
        "--prefill-selector", selector(deployment, ROLE_PREFILL),
        "--decode-selector", selector(deployment, ROLE_DECODE),
        *mode,
        *spec.router.args,
    ]  # fmt: skip


ENGINE: Final = PDWorker()
