"""Every kopf registration of the operator, in one place (STYLE.md: one place registers).

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
from pdwarden.handlers import deployment as handlers
from pdwarden.handlers import policy as policy_handlers
from pdwarden.k8s import KubeClient
from pdwarden.k8s.foreign import ForeignPods
from pdwarden.remediation.scrape.client import DEFAULT_MAX_BODY, WorkerClient


@dataclass(frozen=True)
class RunConfig:
    resync_seconds: float = 5.0
    token_key: bytes | None = None
    global_dry_run: bool = False
    peering_lifetime: int = 60
    max_metrics_bytes: int = DEFAULT_MAX_BODY
    policies: bool = True  # watch PDRemediationPolicies (pdwarden run --no-policies: off)


def build_registry(config: RunConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

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
        client = KubeClient.from_environment()
        memo.state = handlers.OperatorState(
            client=client,
            token_key=config.token_key,
            global_dry_run=config.global_dry_run,
            workers=WorkerClient(max_body=config.max_metrics_bytes),
        )
        memo.policies = policy_handlers.PolicyState(
            client=client,
            workers=memo.state.workers,
            foreign=ForeignPods(client),
            global_dry_run=config.global_dry_run,
        )

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as KubeClient.from_environment: in a pod the ServiceAccount,
        # elsewhere KUBECONFIG. Through the official client, because kopf's own kubeconfig
        # reader ignores `tokenFile` (a pod's kubeconfig on the local kubelet, exec plugins).
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    @kopf.on.resume(*resource, registry=registry, id=HANDLER_RECONCILE)
    @kopf.on.create(*resource, registry=registry, id=HANDLER_RECONCILE)
    @kopf.on.update(*resource, registry=registry, id=HANDLER_RECONCILE)
    async def reconcile_on_change(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await handlers.reconcile_now(memo.state, body, force_apply=True)

    # Daemons rather than timers: kopf cancels daemons when it pauses (a higher-priority peer
    # appeared) or stops, whereas a timer that is busy at that moment is left running orphaned.
    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_RESYNC, cancellation_timeout=2.0, initial_delay=1.0
    )
    async def resync(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        while not stopped:
            try:
                await handlers.reconcile_now(memo.state, body, force_apply=False)
            except kopf.TemporaryError as e:
                logging.getLogger("pdwarden.main").warning("resync: %s", e)
            await asyncio.sleep(config.resync_seconds)

    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_SCRAPE, cancellation_timeout=2.0, initial_delay=1.0
    )
    async def remediation_loop(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        while not stopped:
            interval = await handlers.remediation_cycle(memo.state, body)
            await asyncio.sleep(interval)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.state.workers.close()

    @kopf.on.delete(*resource, registry=registry, id=HANDLER_FORGET, optional=True)
    async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        handlers.forget(memo.state, body)

    if config.policies:
        _register_policies(registry)
    return registry


def _register_policies(registry: kopf.OperatorRegistry) -> None:
    """PDRemediationPolicy: one remediation daemon per policy (no reconcile: it creates
    nothing). Not registered with --no-policies, so kopf never watches the kind."""
    resource = (GROUP, VERSION, POLICY_PLURAL)

    @kopf.daemon(
        *resource, registry=registry, id=HANDLER_POLICY, cancellation_timeout=2.0, initial_delay=1.0
    )
    async def policy_loop(body: kopf.Body, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        while not stopped:
            interval = await policy_handlers.policy_cycle(memo.policies, body)
            await asyncio.sleep(interval)

    @kopf.on.delete(*resource, registry=registry, id=HANDLER_POLICY_FORGET, optional=True)
    async def policy_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        policy_handlers.forget_policy(memo.policies, body)
