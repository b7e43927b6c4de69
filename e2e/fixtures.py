"""pytest fixtures for tests that need Kubernetes: one real control plane per test session.

By default the session starts its own local cluster (e2e.cluster) in a temporary directory and
stops it at the end, so it never touches a cluster a user left running with `make cluster-up`.
Set PDWARDEN_E2E_KUBECONFIG to run the same tests against any existing cluster (kind, a real
one) instead; nothing is started or stopped then.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.cluster.controlplane import LocalCluster, build_binaries, random_pod_cidr_octet

EXTERNAL_ENV = "PDWARDEN_E2E_KUBECONFIG"


@dataclass
class Cluster:
    """A reachable Kubernetes API and the pinned kubectl to talk to it."""

    kubeconfig: str
    bin_dir: Path
    local: LocalCluster | None

    @property
    def kubectl_path(self) -> str:
        return str(self.bin_dir / "kubectl")

    @property
    def helm_path(self) -> str:
        return str(self.bin_dir / "helm")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}"
            )
        return out

    def wait_until(self, what: str, check: object, timeout: float = 60) -> None:
        """Poll `check()` (any callable returning truthy) until true or fail the test."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            last = check()  # type: ignore[operator]
            if last:
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get(EXTERNAL_ENV)
    bin_dir = build_binaries()
    if external:
        yield Cluster(kubeconfig=external, bin_dir=bin_dir, local=None)
        return
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), pod_cidr_octet=random_pod_cidr_octet())
    atexit.register(local.stop, quiet=True)  # also on Ctrl-C or a crash of the session
    try:
        local.start()
    except BaseException:
        local.stop(quiet=True)
        raise
    try:
        yield Cluster(kubeconfig=str(local.kubeconfig), bin_dir=bin_dir, local=local)
    finally:
        local.stop(quiet=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_until(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
