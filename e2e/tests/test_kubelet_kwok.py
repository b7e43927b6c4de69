"""kwok fake GPU nodes (issue 3, part 4): scheduled pods go Running without a process, and the
local kubelet's nodes and pods are untouched.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster
from e2e.kubelet.kwok import SCALE_POD_PLACEMENT, KwokNodes
from e2e.tests.test_kubelet import apply, condition, get

pytestmark = pytest.mark.cluster


def test_kwok_gpu_nodes_run_fake_pods(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    prefix = f"kwok-{uuid.uuid4().hex[:6]}-"
    kwok = KwokNodes(cluster.kubeconfig, 3, prefix=prefix, log_path=tmp_path / "kwok.log")
    try:
        took = kwok.start(ready_timeout=60)
        print(f"3 kwok nodes Ready in {took:.1f}s")
        node = get(cluster, "", "node", f"{prefix}0")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "fake"},
            "spec": {
                **SCALE_POD_PLACEMENT,
                "containers": [{"name": "c", "image": "anything:latest",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            },
        }  # fmt: skip
        apply(cluster, namespace, pod)

        def ready() -> dict[str, Any] | None:
            p = get(cluster, namespace, "pod", "fake")
            return p if condition(p, "Ready") == "True" else None

        cluster.wait_until("kwok pod Ready", ready, timeout=60)
        p = ready() or {}
        assert p["spec"]["nodeName"].startswith(prefix)
        assert p["status"].get("podIP")
    finally:
        kwok.stop()
    assert get(cluster, "", "node", f"{prefix}0") is None
