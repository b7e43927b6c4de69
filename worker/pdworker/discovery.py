"""Where workers find each other: the router's prefill and decode workers, decode's prefills.

Kubernetes discovery lists pods by label selector and keeps only Ready ones, so a decode pod that
the operator cordons (readiness gate False) stops getting new work. `PodPorts` is decode's view of
its own deployment's prefill pods (their IPs and declared bootstrap ports), from which it builds
the only bootstrap endpoints it dials (allow.py). The `kubernetes` client is imported only on
these paths: a router with static endpoints needs no Kubernetes libraries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Discovery(Protocol):
    def prefill(self) -> list[str]: ...

    def decode(self) -> list[str]: ...


def parse_endpoints(value: str) -> list[str]:
    """`http://127.0.0.1:8001,http://127.0.0.1:8002` -> normalised base URLs."""
    out = []
    for raw in value.split(","):
        item = raw.strip().rstrip("/")
        if not item:
            continue
        if not item.startswith(("http://", "https://")):
            item = "http://" + item
        out.append(item)
    return out


class StaticDiscovery:
    def __init__(self, prefill: list[str], decode: list[str]) -> None:
        self._prefill = prefill
        self._decode = decode

    def prefill(self) -> list[str]:
        return list(self._prefill)

    def decode(self) -> list[str]:
        return list(self._decode)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return obj


def ready_pod_urls(pods: Iterable[Any], port: int) -> list[str]:
    """URLs of pods that are Running, not terminating, have an IP and a Ready=True condition."""
    urls = []
    for pod in pods:
        meta = _get(pod, "metadata")
        if _get(meta, "deletion_timestamp") or _get(meta, "deletionTimestamp"):
            continue
        if _get(pod, "status", "phase") != "Running":
            continue
        ip = _get(pod, "status", "pod_ip") or _get(pod, "status", "podIP")
        conditions = _get(pod, "status", "conditions") or []
        ready = any(
            _get(cond, "type") == "Ready" and _get(cond, "status") == "True" for cond in conditions
        )
        if ip and ready:
            urls.append(f"http://{ip}:{port}")
    return sorted(urls)


def running_pod_ports(pods: Iterable[Any], port_name: str) -> set[tuple[str, int]]:
    """(IP, port) of the container port named `port_name` of every Running pod that has an IP
    and is not being deleted (readiness does not matter: a busy prefill is still ours)."""
    out = set()
    for pod in pods:
        if _get(pod, "metadata", "deletion_timestamp") or _get(
            pod, "metadata", "deletionTimestamp"
        ):
            continue
        ip = _get(pod, "status", "pod_ip") or _get(pod, "status", "podIP")
        if _get(pod, "status", "phase") != "Running" or not ip:
            continue
        for container in _get(pod, "spec", "containers") or []:
            for port in _get(container, "ports") or []:
                number = _get(port, "container_port") or _get(port, "containerPort")
                if _get(port, "name") == port_name and isinstance(number, int):
                    out.add((str(ip), number))
    return out


def _core_api() -> Any:
    from kubernetes import client, config  # lazy: only the Kubernetes paths need the client

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.CoreV1Api()


class PodPorts:
    """A named container port of the pods one label selector matches, kept fresh by a thread
    (every `interval`) and on demand (`refresh`, which callers rate-limit)."""

    def __init__(
        self, namespace: str, selector: str, port_name: str, interval: float = 2.0
    ) -> None:
        self._api = _core_api()
        self.namespace = namespace
        self.selector = selector
        self.port_name = port_name
        self.interval = interval
        self._endpoints: frozenset[tuple[str, int]] = frozenset()
        self.listed = False  # one listing has succeeded
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="k8s-pod-ports", daemon=True).start()

    def refresh(self) -> bool:
        """List the pods now (blocking: call it on a thread); False, keeping the last good view,
        when the API server cannot be asked."""
        try:
            pods = self._api.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _request_timeout=5
            ).items
        except Exception as exc:
            log.warning("listing pods %s in %s failed: %s", self.selector, self.namespace, exc)
            return False
        self._endpoints = frozenset(running_pod_ports(pods, self.port_name))
        self.listed = True
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def endpoints(self) -> frozenset[tuple[str, int]]:
        return self._endpoints

    def close(self) -> None:
        self._stop.set()


class KubernetesDiscovery:
    """Polls the API server for pods by label selector; never returns a NotReady pod."""

    def __init__(
        self,
        namespace: str,
        prefill_selector: str,
        decode_selector: str,
        port: int,
        interval: float = 2.0,
    ) -> None:
        self._api = _core_api()
        self.namespace = namespace
        self.selectors = {"prefill": prefill_selector, "decode": decode_selector}
        self.port = port
        self.interval = interval
        self._urls: dict[str, list[str]] = {"prefill": [], "decode": []}
        self._stop = threading.Event()
        self.refresh()
        threading.Thread(target=self._loop, name="k8s-discovery", daemon=True).start()

    def refresh(self) -> None:
        for role, selector in self.selectors.items():
            try:
                pods = self._api.list_namespaced_pod(
                    self.namespace, label_selector=selector, _request_timeout=10
                ).items
            except Exception as exc:  # keep the last good view on API errors
                log.warning("listing %s pods failed: %s", role, exc)
                continue
            self._urls[role] = ready_pod_urls(pods, self.port)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def close(self) -> None:
        self._stop.set()

    def prefill(self) -> list[str]:
        return list(self._urls["prefill"])

    def decode(self) -> list[str]:
        return list(self._urls["decode"])
