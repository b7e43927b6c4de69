"""Every kopf registration of the operator, in one place (nothing else registers a handler).

Why a function rather than module-level decorators: `pdwarden run` builds the registry with the
options it was given (resync period), and tests can build one without side effects on import.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from pdwarden.constants import (
    ANNOTATION_PREFIX,
    FINALIZER,
    GROUP,
    HANDLER_FORGET,
    HANDLER_POLICY,
    HANDLER_POLICY_FORGET,
    HANDLER_RECONCILE,
    HANDLER_RESYNC,
    HANDLER_SCRAPE,
    PLURAL,
    POLICY_PLURAL,
    VERSION,
)
from pdwarden.handlers import on_deployment as handlers
from pdwarden.handlers import on_policy as policy_handlers
from pdwarden.k8s import KubeClient
from pdwarden.k8s.cache import ObjectCache
from pdwarden.k8s.cached import CachedKube, Watches
from pdwarden.k8s.foreign import ForeignPods
from pdwarden.ports import KubeApi
from pdwarden.reconciling.resync import ResyncGate
from pdwarden.remediation.act.worker_admin import WorkerAdmin
from pdwarden.remediation.scrape.prometheus import PrometheusConfig, PrometheusScreen
from pdwarden.remediation.scrape.worker_client import DEFAULT_MAX_BODY, WorkerClient
from pdwarden.sharding import Shard, owned_by
from pdwarden.tokens import TokenKey


@dataclass(frozen=True)
class RunConfig:
    resync_seconds: float = 5.0
    token_key: TokenKey | None = None  # read again when its file changes
    global_dry_run: bool = False
    peering_lifetime: int = 60
    max_metrics_bytes: int = DEFAULT_MAX_BODY
    policies: bool = True  # watch PDRemediationPolicies (pdwarden run --no-policies: off)
    namespaces: tuple[str, ...] = ()  # the operator's scope; empty: the whole cluster
    watch_cache: bool = True  # serve pod/workload lists from watches (--no-watch-cache: off)
    operator_namespace: str | None = None  # pdwarden run --operator-namespace
    shard: Shard | None = None  # pdwarden run --shard I/N: handle only this replica's share
    prometheus: PrometheusConfig | None = None  # pdwarden run --observe prometheus: the screen


def exact_namespaces(namespaces: tuple[str, ...]) -> bool:
    """Whether the scope is a list of namespace names (no kopf globs or exclusions)."""
    return bool(namespaces) and all(not any(c in ns for c in "*?[]!,") for ns in namespaces)


def build_registry(config: RunConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)
    mine = owned_by(config.shard)  # every object handler's filter (sharding.py)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING
        settings.peering.lifetime = config.peering_lifetime
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        # Scoped to named namespaces (the chart's namespaced mode grants nothing cluster-wide),
        # kopf's scan of Namespaces and CRDs is refused and retried for minutes, an ERROR each
        # time; the names are exact, so nothing is lost by not scanning (CRDs must exist at
        # start, which the chart and `kubectl apply` ensure).
        settings.scanning.disabled = exact_namespaces(config.namespaces)
        client = KubeClient.from_environment()
        kube: KubeApi = client
        cache = None
        if config.watch_cache:
            cache = ObjectCache(namespaces=config.namespaces)
            memo.watches = Watches(client.api, cache)
            memo.watches.start(asyncio.get_running_loop())
            kube = CachedKube(client, cache)
        rotating = config.token_key.rotated_lately if config.token_key else None
        memo.gate = ResyncGate(cache, spacing=config.resync_seconds, rotating=rotating)
        workers, admin = WorkerClient(max_body=config.max_metrics_bytes), WorkerAdmin()
        screen = PrometheusScreen(config.prometheus) if config.prometheus else None
        memo.state = handlers.OperatorState(
            client=kube,
            token_key=config.token_key,
            global_dry_run=config.global_dry_run,
            workers=workers,
            admin=admin,
            operator_namespace=config.operator_namespace,
            screen=screen,
        )
        memo.policies = policy_handlers.PolicyState(
            client=kube,
            workers=workers,
            admin=admin,
            foreign=ForeignPods(client),
            global_dry_run=config.global_dry_run,
            screen=screen,
        )

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as KubeClient.from_environment: in a pod the ServiceAccount,
        # elsewhere KUBECONFIG. Through the official client, because kopf's own kubeconfig
        # reader ignores `tokenFile` (a pod's kubeconfig on the local kubelet, exec plugins).
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    @kopf.on.resume(*resource, registry=registry, id=HANDLER_RECONCILE, when=mine)
    @kopf.on.create(*resource, registry=registry, id=HANDLER_RECONCILE, when=mine)
    @kopf.on.update(*resource, registry=registry, id=HANDLER_RECONCILE, when=mine)
    async def reconcile_on_change(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await handlers.reconcile_now(memo.state, body, force_apply=True)

    # Daemons rather than timers: kopf cancels daemons when it pauses (a higher-priority peer
    # appeared) or stops, whereas a timer that is busy at that moment is left running orphaned.
    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_RESYNC, cancellation_timeout=2.0,
        initial_delay=1.0, when=mine,
    )  # fmt: skip
    async def resync(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        gate: ResyncGate = memo.gate
        while not stopped and not handlers.is_gone(memo.state, body):
            if gate.due(body):
                gate.begin(body)
                result, failed = None, 0.0
                try:
                    result = await handlers.reconcile_now(memo.state, body, force_apply=False)
                except kopf.TemporaryError as e:
                    logging.getLogger("pdwarden.main").warning("resync: %s", e)
                    failed = e.delay or 0.0
                gate.finished(body, result)
                # A failed pass (the API server erring or throttling us) is tried again no
                # sooner than kopf retries a failed handler: every second, a dozen writes a
                # time, it was most of the load on a throttled level.
                await stopped.wait(failed)
            await gate.wait(body)
        if handlers.is_gone(memo.state, body):  # deleted unseen by kopf: no delete handler
            handlers.forget(memo.state, body)
            gate.forget(body["metadata"]["uid"])

    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_SCRAPE, cancellation_timeout=2.0,
        initial_delay=1.0, when=mine,
    )  # fmt: skip
    async def remediation_loop(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        # Fixed rate: a cycle starts every interval (scrapeIntervalSeconds is the time between
        # two scrapes of a pod), not an interval after the last one ended. One that overran
        # its interval is followed by the next after a fifth of it: an overloaded operator
        # falls behind, it does not spin.
        loop = asyncio.get_running_loop()
        while not stopped and not handlers.is_gone(memo.state, body):
            started = loop.time()
            interval = await handlers.remediation_cycle(memo.state, body)
            await asyncio.sleep(max(interval / 5, interval - (loop.time() - started)))
        if handlers.is_gone(memo.state, body):
            handlers.forget(memo.state, body)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if "watches" in memo:
            memo.watches.stop()
        await memo.state.workers.close()
        await memo.state.admin.close()
        if memo.state.screen is not None:
            await memo.state.screen.close()

    @kopf.on.delete(*resource, registry=registry, id=HANDLER_FORGET, optional=True, when=mine)
    async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        handlers.forget(memo.state, body)
        memo.gate.forget(body["metadata"]["uid"])

    if config.policies:
        _register_policies(registry, mine)
    return registry


def _register_policies(registry: kopf.OperatorRegistry, mine: Any) -> None:
    """PDRemediationPolicy: one remediation daemon per policy (no reconcile: it creates
    nothing). Not registered with --no-policies, so kopf never watches the kind."""
    resource = (GROUP, VERSION, POLICY_PLURAL)

    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_POLICY, cancellation_timeout=2.0,
        initial_delay=1.0, when=mine,
    )  # fmt: skip
    async def policy_loop(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        while not stopped and not policy_handlers.policy_gone(memo.policies, body):
            interval = await policy_handlers.policy_cycle(memo.policies, body)
            await asyncio.sleep(interval)
        if policy_handlers.policy_gone(memo.policies, body):
            policy_handlers.forget_policy(memo.policies, body)

    @kopf.on.delete(
        *resource, registry=registry, id=HANDLER_POLICY_FORGET, optional=True, when=mine
    )
    async def policy_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        policy_handlers.forget_policy(memo.policies, body)
