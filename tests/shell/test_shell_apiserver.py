"""The guarded status write against a real API server: what the in-memory fake assumes is true.

`KubeFake` answers a merge patch of /status that carries an out-of-date
metadata.resourceVersion with 409; this test shows the real kube-apiserver does the same, and
that two writers, each working from its own stale copy, still end with every ledger entry.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from e2e.fixtures import Cluster
from e2e.pdtools import apply, cpu_example
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from pdwarden.api import LedgerEntry, PDDeploymentStatus, RemediationStatus, status_to_wire
from pdwarden.constants import API_VERSION, KIND
from pdwarden.k8s import ApiError, KubeClient
from pdwarden.remediation.record.store import DEPLOYMENT, Known, read, write

pytestmark = pytest.mark.cluster
ROUNDS = 6


def client_for(cluster: Cluster) -> KubeClient:
    config = k8s.Configuration()
    k8s_config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=config)  # type: ignore[no-untyped-call]
    return KubeClient(k8s.ApiClient(config))


def with_entry(known: Known[PDDeploymentStatus], pod: str, n: int) -> PDDeploymentStatus:
    status = known.status
    rem = status.remediation or RemediationStatus()
    e = LedgerEntry(
        time=datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=100 - n),
        action="FailRooms", pod=pod, rooms=n, reason=f"round {n}",
    )  # fmt: skip
    return status.model_copy(
        update={"remediation": rem.model_copy(update={"history": [*rem.history, e]})}
    )


def test_two_writers_with_stale_copies_keep_every_entry(
    cluster: Cluster, namespace: str, crd: str
) -> None:
    apply(cluster, namespace, cpu_example())
    kube = client_for(cluster)

    async def main() -> list[int]:
        start = await read(DEPLOYMENT, kube, namespace, "pd")
        # The API server itself refuses a write from an out-of-date copy.
        await kube.patch_status(API_VERSION, KIND, namespace, "pd",
                                status_to_wire(with_entry(start, "p", 0)),
                                resource_version=start.resource_version)  # fmt: skip
        with pytest.raises(ApiError) as refused:
            await kube.patch_status(API_VERSION, KIND, namespace, "pd",
                                    status_to_wire(with_entry(start, "p", 99)),
                                    resource_version=start.resource_version)  # fmt: skip
        assert refused.value.status == 409
        # Two replicas, each computing from the copy it last wrote (never re-read).
        copies = {"a": start, "b": start}
        for n in range(1, ROUNDS + 1):
            who = "ab"[n % 2]
            base = copies[who]
            copies[who] = await write(
                DEPLOYMENT,
                kube,
                namespace,
                "pd",
                base=base,
                new=with_entry(base, f"replica-{who}", n),
            )
        final = await read(DEPLOYMENT, kube, namespace, "pd")
        return [e.rooms for e in (final.status.remediation or RemediationStatus()).history]

    assert asyncio.run(main()) == list(range(ROUNDS + 1))
