"""The foreign-pod verbs fail clearly and within their deadline when the API server does not answer.

No cluster: a loopback socket that accepts connections and never replies stands in for a hung
API server, and a closed port for one that is down.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from pdwarden.constants import LABEL_SERVING
from pdwarden.k8s.client import KubeClient
from pdwarden.k8s.foreign import ForeignActionError, evict_pod, set_pod_label
from pdwarden.values import LabelPatch


def _client(port: int) -> KubeClient:
    cfg = k8s.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = 0
    return KubeClient(k8s.ApiClient(cfg), timeout=30)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listening socket that never answers (the backlog takes the connection)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


def test_a_hung_api_server_is_an_error_naming_pod_and_verb(silent_port: int) -> None:
    kube = _client(silent_port)
    with pytest.raises(ForeignActionError, match=r"evict pod ns/d0: .*") as err:
        asyncio.run(evict_pod(kube, "ns", "d0", "uid", deadline=0.5))
    assert err.value.status == 0 and err.value.transient
    patch = LabelPatch("d0", "uid", "7", LABEL_SERVING, "false")
    with pytest.raises(ForeignActionError, match=r"label pdwarden.dev/serving=false on pod ns/d0"):
        asyncio.run(set_pod_label(kube, "ns", patch, deadline=0.5))


def test_a_down_api_server_is_an_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(ForeignActionError, match=r"evict pod ns/d0"):
        asyncio.run(evict_pod(_client(port), "ns", "d0", "uid", deadline=2))
