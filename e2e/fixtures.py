"""pytest fixtures for tests that need Kubernetes: one real control plane per test session.

By default the session starts its own local cluster (e2e.cluster) in a temporary directory and
stops it at the end, so it never touches a cluster a user left running with `make cluster-up`.
Set PDWARDEN_E2E_KUBECONFIG to run the same tests against any existing cluster (kind, a real
one) instead; nothing is started or stopped then.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from e2e import promtool
from e2e.cluster.controlplane import (
    LocalCluster,
    build_binaries,
    free_port,
)

EXTERNAL_ENV = "PDWARDEN_E2E_KUBECONFIG"
# Remediation cycles finished, whatever their outcome, per PDDeployment (operator/pdwarden/
# metrics.py REMEDIATION_CYCLES); summed over the deployments of one test's operator.
CYCLES_METRIC = "pdwarden_remediation_cycles_total"
# Longest a test waits for earlier tests' pods to finish terminating before it starts.
QUIET_TIMEOUT = 120.0
T = TypeVar("T")


@dataclass
class Cluster:
    """A reachable Kubernetes API and the pinned kubectl to talk to it."""

    kubeconfig: str
    bin_dir: Path
    local: LocalCluster | None
    # Every metric family any test's operator served before it stopped (e2e/promtool.py).
    metrics_seen: set[str] = field(default_factory=set)

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

    def wait_until(
        self,
        what: str,
        check: Callable[[], T],
        timeout: float = 60,
        explain: Callable[[], object] | None = None,
    ) -> T:
        """Poll `check()` until it returns something truthy (returned) or fail the test; the
        failure shows `explain()` too (what the operator thought), so a rare timeout in CI says
        why without a rerun."""
        deadline = time.monotonic() + timeout
        last: T | None = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(0.3)
        why = f"; {explain()!r}" if explain is not None else ""
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r}){why}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get(EXTERNAL_ENV)
    bin_dir = build_binaries()
    if external:
        yield Cluster(kubeconfig=external, bin_dir=bin_dir, local=None)
        return
    local = LocalCluster(tmp_path_factory.mktemp("cluster"))
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


def pods_terminating(cluster: Cluster) -> list[str]:
    """Pods anywhere in the cluster that are being torn down (a deletionTimestamp is set)."""
    out = cluster.kubectl(
        "get", "pods", "--all-namespaces", "-o",
        "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}"
        "{.metadata.namespace}/{.metadata.name}{'\\n'}{end}",
        check=False,
    )  # fmt: skip
    return out.stdout.split()


def wait_quiet(cluster: Cluster, timeout: float = QUIET_TIMEOUT) -> None:
    """Wait until no pod of an earlier test is still being torn down, so a test's clock does not
    start while the local kubelet stops other tests' workers on the same cores. Bounded: after
    `timeout` the test starts anyway (and says which pods were still going)."""
    deadline = time.monotonic() + timeout
    while (left := pods_terminating(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        print(f"[fixtures] cluster not quiet after {timeout:.0f}s: {left[:5]}", file=sys.stderr)


def release_pddeployments(cluster: Cluster, namespace: str) -> None:
    """Drop the operator's finalizer from PDDeployments left in a namespace being deleted once
    no operator runs for them: otherwise the namespace stays Terminating for the rest of the
    session and the controller-manager keeps retrying it."""
    out = cluster.kubectl("get", "pdd", "-n", namespace, "-o", "name", check=False)
    for name in out.stdout.split() if out.returncode == 0 else []:
        cluster.kubectl(
            "patch", name, "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip


def create_namespace(cluster: Cluster, prefix: str) -> str:
    """A fresh namespace named `prefix-<random>`, returned once its default ServiceAccount exists
    (pods cannot be created in it before)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_until(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    return name


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test (created once the cluster is quiet), deleted afterwards."""
    wait_quiet(cluster)
    name = create_namespace(cluster, "t")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    release_pddeployments(cluster, name)


REPO_ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = REPO_ROOT / "crds" / "pddeployments.pdwarden.dev.yaml"


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> str:
    """The PDDeployment CRD, installed (server-side apply) and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    wait_established(cluster, "pddeployments.pdwarden.dev")
    return "pddeployments.pdwarden.dev"


def wait_established(cluster: Cluster, crd: str) -> None:
    """Wait until a just-applied CRD is Established. Not `kubectl wait`: right after the apply
    the CRD may have no status.conditions yet, and kubectl wait then fails at once ("<nil> is of
    the type <nil>") instead of waiting."""
    cluster.wait_until(
        f"CRD {crd} Established",
        lambda: "True" in cluster.kubectl(
            "get", f"crd/{crd}", "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False,
        ).stdout,
    )  # fmt: skip


class OperatorProcess:
    """`pdwarden run` as a real process, scoped to some namespaces, with its own ports."""

    def __init__(
        self,
        cluster: Cluster,
        namespaces: list[str],
        log_path: Path,
        *extra: str,
        env: dict[str, str] | None = None,
    ):
        self.cluster = cluster
        self.namespaces = namespaces
        self.log_path = log_path
        self.extra = list(extra)
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    def start(self) -> OperatorProcess:
        self.metrics_port = free_port()
        argv = [
            str(Path(sys.executable).parent / "pdwarden"),
            "run",
            *[f"--namespace={ns}" for ns in self.namespaces],
            f"--liveness-port={free_port()}",
            f"--metrics-port={self.metrics_port}",
            "--host=127.0.0.1",
            "--resync-seconds=1",
            *self.extra,
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env={**self.cluster.env, "PYTHONUNBUFFERED": "1", **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self, sig: int = 9) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.cluster.metrics_seen |= promtool.served_families(self.metrics_text())
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics_text(self) -> str:
        """This operator's /metrics, as Prometheus would scrape it."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, /, **labels: str) -> float:
        """Sum of a metric's samples from this operator's /metrics (0 if absent), of those that
        carry every label value given."""
        total = 0.0
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for line in self.metrics_text().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                series = line.rsplit(" ", 1)[0]
                if all(w in series for w in want):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def wait_cycles(self, cycles: int, metric: str = CYCLES_METRIC, timeout: float = 120) -> float:
        """Wait until this operator has begun and finished `cycles` more cycles after this call
        (one more than asked: the cycle running now may have started before the call).

        "Nothing happened" is asserted after this, never after a sleep: a cycle that would have
        acted has then provably run. Default: remediation cycles (`pdwarden_remediation_cycles`,
        each test's operator watches only its own namespace). Pass "pdwarden_reconcile_passes_total"
        for reconcile passes."""
        start = self.metric(metric)
        want = start + cycles + 1
        deadline = time.monotonic() + timeout
        while (now := self.metric(metric)) < want:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"the operator exited while waiting for {metric}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the operator ran {now - start:.0f} of {cycles + 1} cycles ({metric}) "
                    f"in {timeout}s; log: {self.log_path}"
                )
            time.sleep(0.2)
        return now

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def operator(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """A running operator watching only this test's namespace."""
    op = OperatorProcess(cluster, [namespace], tmp_path / "operator.log").start()
    yield op
    op.stop()


PEERING = """
apiVersion: kopf.dev/v1
kind: KopfPeering
metadata:
  name: pdwarden
"""


def peering(cluster: Cluster, ns: str) -> None:
    """The kopf peering CRD and a KopfPeering `pdwarden` in `ns`, for replicas run with
    --peering=pdwarden (HA tests)."""
    crd = str(REPO_ROOT / "crds" / "kopf-peering.yaml")
    cluster.kubectl("apply", "--server-side", "-f", crd)
    wait_established(cluster, "kopfpeerings.kopf.dev")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=PEERING)
