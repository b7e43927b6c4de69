"""The operator's own namespace reaches every worker NetworkPolicy it writes.

`pdwarden run --operator-namespace` (default $POD_NAMESPACE, which the chart sets from the
downward API, else the pod's ServiceAccount namespace) is the only way the operator learns where
its pods run; a reconcile pass over `KubeFake` shows it in the NetworkPolicy it applies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from shell_fakes import KubeFake, WorkerFake, pddeployment

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, reconcile_now
from pdwarden.run import operator_namespace


def applied_policy(operator_ns: str | None) -> Any:
    kube = KubeFake()
    pddeployment(kube)
    state = OperatorState(client=kube, workers=WorkerFake(), operator_namespace=operator_ns)
    asyncio.run(reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=True))
    return kube.obj("NetworkPolicy", "ns", "pd-workers")["spec"]


def test_a_pass_admits_the_operator_from_its_own_namespace_only() -> None:
    ingress = applied_policy("pdw-system")["ingress"]
    operator_peers = [
        peer
        for rule in ingress
        for peer in rule["from"]
        if "app.kubernetes.io/component" in peer.get("podSelector", {}).get("matchLabels", {})
    ]
    assert operator_peers == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pdw-system"}},
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/part-of": "pdwarden",
                    "app.kubernetes.io/component": "operator",
                }
            },
        }
    ]


def test_without_a_namespace_no_operator_pod_is_admitted() -> None:
    ingress = applied_policy(None)["ingress"]
    assert len(ingress) == 1, ingress  # the deployment's own pods only


def test_namespace_comes_from_the_flag_else_the_service_account_file(tmp_path: Path) -> None:
    mounted = tmp_path / "namespace"
    assert operator_namespace("given", mounted) == "given"
    assert operator_namespace(None, mounted) is None  # outside a pod: no file
    mounted.write_text("pdw-system\n")
    assert operator_namespace(None, mounted) == "pdw-system"
    with pytest.raises(SystemExit, match="'Not_A_Namespace' is not a namespace name"):
        operator_namespace("Not_A_Namespace", mounted)
