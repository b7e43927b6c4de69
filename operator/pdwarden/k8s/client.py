"""An async, deadline-bound facade over the official Kubernetes client.

Why: kopf handlers are async, and the official client blocks. Every call here runs in a worker
thread under a hard timeout, so a slow API server can never stall the event loop or a handler
forever; and the few verbs the operator needs (server-side apply, create-once, list by label,
pod status patch, delete with a UID precondition, events) are spelled out in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

from pdwarden.k8s.pacing import Pacer

Obj = dict[str, Any]

# kind -> (plural, namespaced); only kinds the operator writes or reads.
_PLURALS: Final[dict[str, tuple[str, bool]]] = {
    "Pod": ("pods", True),
    "Service": ("services", True),
    "Secret": ("secrets", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Event": ("events", True),
    "StatefulSet": ("statefulsets", True),
    "Deployment": ("deployments", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "NetworkPolicy": ("networkpolicies", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "PDDeployment": ("pddeployments", True),
    "PDRemediationPolicy": ("pdremediationpolicies", True),
}
DEFAULT_TIMEOUT: Final = 15.0
MAX_REASON: Final = 1024
# API calls in flight at once, each on a thread of the client's own pool, with as many pooled
# connections. asyncio's default executor has cpu count + 4 threads (6 on 2 cores) and serves
# everything else too: a burst of reconcile passes (10 deployments created at once, ~15 calls
# each) queued there for seconds before reaching the API server (issue 27, reconcile p99).
API_THREADS: Final = 32
# A request the API server turned away for load (429 with Retry-After: API Priority and
# Fairness rejected it, or max-in-flight; it was never executed) is sent again after the pause
# the server asks, as client-go does, while the call's own deadline allows. The pause is capped
# and stretched by a random half, so the burst that overflowed a level (a reconcile pass
# applies a dozen objects at once) comes back spread out instead of overflowing it again.
THROTTLED_PAUSE_MAX: Final = 5.0
THROTTLED_PAUSE_MIN: Final = 0.25  # no retry sooner than this after a refusal
THROTTLED_TRIES: Final = 10


# How long a call may spend waiting out throttled answers where its caller keeps a clock (a
# remediation cycle: its interval, so that a throttled write fails in time for the next cycle
# to scrape and judge again, its entries carried). Unset: the call's whole timeout.
_THROTTLED_BUDGET: ContextVar[float | None] = ContextVar("throttled_budget", default=None)


@contextlib.contextmanager
def throttled_budget(seconds: float) -> Iterator[None]:
    """Calls made inside (this task and those it starts) wait out throttling `seconds` at most."""
    token = _THROTTLED_BUDGET.set(seconds)
    try:
        yield
    finally:
        _THROTTLED_BUDGET.reset(token)


def transport_retries() -> Retry:
    """urllib3's own retries, as its default (3) for a connection that fails, but not of a
    throttled answer: by default it honours Retry-After itself, in lockstep and holding a
    worker thread, so a refused burst came back all at once and was refused again."""
    return Retry(3, respect_retry_after_header=False)


class ApiError(Exception):
    """An API call failed; `status` is the HTTP status (0 for transport errors or timeouts)."""

    def __init__(self, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after  # seconds the server asked to wait (its Retry-After)

    @property
    def throttled(self) -> bool:
        """Turned away for load before it ran, and asked to come back (safe to send again)."""
        return self.status == 429 and self.retry_after is not None

    @property
    def transient(self) -> bool:
        return self.status in (0, 409, 429) or self.status >= 500


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str = ""
) -> str:
    try:
        plural, namespaced = _PLURALS[kind]
    except KeyError:
        raise ValueError(f"kind {kind} is not one the operator manages") from None
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = base + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def _retry_after(e: ApiException) -> float | None:
    """The Retry-After header in seconds (the API server sends whole seconds), if any."""
    value = (e.headers or {}).get("Retry-After")
    try:
        return min(max(float(value), 0.0), THROTTLED_PAUSE_MAX) if value else None
    except ValueError:  # an HTTP date: not what the API server sends; pause the most
        return THROTTLED_PAUSE_MAX


def _message(e: ApiException) -> str:
    try:
        body = json.loads(e.body or "{}")
    except (ValueError, RecursionError):
        return str(e.reason)[:MAX_REASON]
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or e.reason)[:MAX_REASON]


@dataclass
class KubeClient:
    api: k8s.ApiClient
    timeout: float = DEFAULT_TIMEOUT
    threads: int = API_THREADS
    _pool: ThreadPoolExecutor = field(init=False, repr=False)
    _pacer: Pacer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kube-api")
        self._pacer = Pacer(self.threads)

    @classmethod
    def from_environment(cls) -> KubeClient:
        """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
        config = k8s.Configuration.get_default_copy()
        config.connection_pool_maxsize = API_THREADS  # one connection per thread: no waiting
        config.retries = transport_retries()
        return cls(k8s.ApiClient(config))

    def within(self, seconds: float) -> KubeClient:
        """This client with another timeout, sharing its threads and its pacing (a copy made
        with dataclasses.replace had a pool and a pacer of its own, so its calls escaped both)."""
        other = copy.copy(self)
        other.timeout = seconds
        return other

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        *,
        retry_throttled: bool = True,
    ) -> Obj:
        """One API call under `timeout` (+2 s for the worker thread), throttled answers tried
        again inside it (`retry_throttled`; off where a 429 is itself the answer: evictions),
        no later than the caller's `throttled_budget`."""

        def call(budget: float) -> Obj:
            method_, url, headers, body_, post = self.api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(
                method_, url, header_params=headers, body=body_, post_params=post,
                _request_timeout=budget,
            )  # fmt: skip
            resp.read()  # type: ignore[no-untyped-call]
            if not 200 <= resp.status < 300:
                raise ApiException(http_resp=resp)
            data = json.loads(resp.data or b"{}")
            return data if isinstance(data, dict) else {}

        deadline = time.monotonic() + self.timeout
        retry_until = time.monotonic() + min(self.timeout, _THROTTLED_BUDGET.get() or math.inf)
        for attempt in range(1, THROTTLED_TRIES + 1):
            if not await self._pacer.acquire(retry_until):
                raise ApiError(429, f"{method} {path}: not sent, the API server is throttling us")
            try:
                result = await self._once(call, deadline - time.monotonic(), method, path)
            except ApiError as e:
                if e.throttled:
                    self._pacer.refused()
                if not (retry_throttled and e.throttled) or attempt == THROTTLED_TRIES:
                    raise
                # As long as asked (spread by up to half again), or, where the caller cannot
                # wait that long, what it can spare: one more try, paced, before giving up.
                asked = (e.retry_after or 0.0) * random.uniform(1.0, 1.5)
                pause = min(asked, retry_until - time.monotonic() - THROTTLED_PAUSE_MIN)
                if pause < THROTTLED_PAUSE_MIN:
                    raise
            else:
                self._pacer.answered()
                return result
            finally:
                self._pacer.release()
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last try raises or returns")

    async def _once(
        self, call: Callable[[float], Obj], budget: float, method: str, path: str
    ) -> Obj:
        """One try of `call` on the pool, its errors as ApiError."""
        try:
            running = asyncio.get_running_loop().run_in_executor(self._pool, call, budget)
            return await asyncio.wait_for(running, budget + 2)
        except ApiException as e:
            raise ApiError(int(e.status or 0), _message(e), _retry_after(e)) from None
        except (TimeoutError, OSError, HTTPError) as e:
            # HTTPError: urllib3's MaxRetryError and friends when the API server is down; they
            # are not OSErrors, and must read as "unreachable" (status 0), never escape.
            raise ApiError(0, f"{method} {path}: {type(e).__name__}: {e}"[:MAX_REASON]) from None
        except (ValueError, RecursionError) as e:
            raise ApiError(0, f"{method} {path}: unreadable answer: {type(e).__name__}") from None

    async def apply(self, obj: Obj, field_manager: str) -> Obj:
        """Server-side apply `obj` as `field_manager`, taking ownership of its fields."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self._call(
            "PATCH",
            path,
            body=obj,
            query=[("fieldManager", field_manager), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    async def create(self, obj: Obj) -> Obj | None:
        """Create `obj`; None if it already exists (409), leaving the existing one untouched."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        try:
            return await self._call("POST", path, body=obj)
        except ApiError as e:
            if e.status == 409:
                return None
            raise

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return await self._call("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str
    ) -> list[Obj]:
        data = await self._call(
            "GET",
            resource_path(api_version, kind, namespace),
            query=[("labelSelector", label_selector)],
        )
        items: list[Obj] = data.get("items") or []
        return items

    async def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        status: Obj,
        *,
        resource_version: str | None = None,
    ) -> Obj:
        """Merge-patch the status subresource. With `resource_version` the write is guarded:
        the API server answers 409 if the object changed since that version."""
        body: Obj = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(
            "PATCH",
            resource_path(api_version, kind, namespace, name, "status"),
            body=body,
            content_type="application/merge-patch+json",
        )

    async def patch_metadata(
        self, api_version: str, kind: str, namespace: str, name: str, metadata: Obj
    ) -> Obj:
        """Merge-patch labels/annotations (a None value removes a key)."""
        return await self._call(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            body={"metadata": metadata},
            content_type="application/merge-patch+json",
        )

    async def set_pod_condition(self, namespace: str, name: str, condition: Obj) -> Obj:
        """Add or replace one pod condition (strategic merge keys conditions by type)."""
        return await self._call(
            "PATCH",
            resource_path("v1", "Pod", namespace, name, "status"),
            body={"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod only if it is still the incarnation `uid`; False if it is gone."""
        try:
            await self._call(
                "DELETE",
                resource_path("v1", "Pod", namespace, name),
                body={"preconditions": {"uid": uid}},
            )
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    async def create_event(self, event: Obj) -> None:
        await self._call(
            "POST", resource_path("v1", "Event", event["metadata"]["namespace"]), event
        )
