"""Where the demo runs and what it installs: a cluster, the CRD, the operator; and the clean-up.

Why: the demo must work on a fresh machine (start the local control plane), next to a cluster a
user left running (reuse it, leave it running) and on any cluster named by KUBECONFIG, and it must
leave each of them as it found it so that it runs twice in a row. That bookkeeping lives here so
the stories (e2e/demo_pdworker.py, e2e/demo_vllm.py, e2e/demo_sglang.py) read as what they tell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster.controlplane import REPO_ROOT, LocalCluster, build_binaries
from e2e.fixtures import CRD_FILE, Cluster, OperatorProcess, wait_established
from pdwarden.constants import CRD_NAME

NAMESPACE = "pdwarden-demo"
RELEASE = "pdwarden-demo"
CHART = REPO_ROOT / "helm" / "pdwarden"
Say = Callable[[str], None]


@dataclass
class Setup:
    """What the demo acquired, so that clean-up undoes exactly that and nothing else."""

    cluster: Cluster
    say: Say
    started_local: LocalCluster | None = None  # a local cluster this run started (stopped at end)
    operator: str = ""  # "helm" or "local"
    local_operator: OperatorProcess | None = None
    log_dir: Path = field(default_factory=lambda: REPO_ROOT / "demo-output")

    def helm(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.cluster.helm_path, *args, "-n", NAMESPACE],
            env=self.cluster.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def acquire_cluster(say: Say, cluster_dir: Path, keep: bool) -> tuple[Cluster, LocalCluster | None]:
    """KUBECONFIG if set; else a local cluster already running from cluster_dir; else start one:
    in cluster_dir when it is to be kept, otherwise in a temporary directory (a fresh etcd that
    goes away with it, so nothing of this run outlives it)."""
    say("preparing kubectl and helm (the first build of the control plane takes 15-40 minutes)")
    bin_dir = build_binaries()
    external = os.environ.get("KUBECONFIG")
    if external:
        say(f"KUBECONFIG is set: using that cluster ({external}); nothing local is started")
        return Cluster(kubeconfig=external, bin_dir=bin_dir, local=None), None
    if LocalCluster(cluster_dir).running_pids():
        local = LocalCluster(cluster_dir)
        say(f"reusing the local cluster already running from {cluster_dir} (left running after)")
        return Cluster(kubeconfig=str(local.kubeconfig), bin_dir=bin_dir, local=local), None
    if keep:
        local = LocalCluster(cluster_dir)
        say(f"starting a local Kubernetes control plane + kubelet in {cluster_dir} (kept) ...")
    else:
        local = LocalCluster(Path(tempfile.mkdtemp(prefix="pdwarden-demo-cluster-")))
        say(f"starting a temporary local Kubernetes (control plane + kubelet) in {local.directory}")
    try:
        local.start()
    except BaseException:
        local.stop(quiet=True)
        say(f"the local cluster did not start; its logs are in {local.directory / 'logs'}")
        raise
    say("local cluster is up: etcd, kube-apiserver, controller-manager, scheduler, kubelet")
    return Cluster(kubeconfig=str(local.kubeconfig), bin_dir=bin_dir, local=local), local


def wait_namespace_gone(cluster: Cluster, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.kubectl("get", "namespace", NAMESPACE, check=False)
        if out.returncode != 0:
            return True
        time.sleep(1)
    return False


def install(setup: Setup, operator: str) -> None:
    """A fresh namespace, the CRD, and the operator (the Helm chart, else a local process)."""
    cluster, say = setup.cluster, setup.say
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode == 0:
        say(f"namespace {NAMESPACE} is left from an earlier run; removing it first")
        remove(setup, wait=True)
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.wait_until(
        "the namespace's default ServiceAccount",
        lambda: (
            cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0
        ),
    )
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    wait_established(cluster, CRD_NAME)
    say(f"CRD {CRD_NAME} installed (server-side apply) and Established")
    if operator == "helm":
        say(
            f"helm install {RELEASE} helm/pdwarden -n {NAMESPACE} (operator under the chart's RBAC)"
        )
        out = setup.helm(
            "install",
            RELEASE,
            str(CHART),
            "--wait",
            "--timeout=150s",
            "--set",
            f"watchNamespaces={{{NAMESPACE}}},image.tag=dev,resyncSeconds=1",
            "--set",
            "metrics.service.enabled=false",
        )
        if out.returncode == 0:
            setup.operator = "helm"
            say("operator running: a pod of the Helm release, as its own ServiceAccount")
            return
        say(f"helm install failed; falling back to a local `pdwarden run`: {out.stderr.strip()}")
        setup.helm("uninstall", RELEASE, "--wait", "--timeout=60s")
    setup.log_dir.mkdir(parents=True, exist_ok=True)
    setup.local_operator = OperatorProcess(
        cluster, [NAMESPACE], setup.log_dir / "operator.log"
    ).start()
    setup.operator = "local"
    say(f"operator running as a local process: `pdwarden run -n {NAMESPACE}` (log: operator.log)")


def remove(setup: Setup, wait: bool) -> None:
    """Undo install(): PDDeployments (while the operator can still drop its finalizer), the
    operator, the namespace. The CRD stays: other namespaces may hold PDDeployments."""
    cluster = setup.cluster
    cluster.kubectl(
        "delete", "pdd", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False
    )
    # An operator that is gone can no longer remove its finalizer; nothing else would.
    names = cluster.kubectl("get", "pdd", "-n", NAMESPACE, "-o", "name", check=False).stdout
    for name in names.split():
        cluster.kubectl(
            "patch",
            name,
            "-n",
            NAMESPACE,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"finalizers": None}}),
            check=False,
        )
    if setup.local_operator is not None:
        setup.local_operator.stop()
        setup.local_operator = None
    if setup.helm("status", RELEASE).returncode == 0:
        setup.helm("uninstall", RELEASE, "--wait", "--timeout=90s")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    if wait and not wait_namespace_gone(cluster):
        print(f"warning: namespace {NAMESPACE} is still terminating", file=sys.stderr)


def teardown(setup: Setup, keep_cluster: bool) -> None:
    """Clean up; stop (and delete) the local cluster this run started unless asked to keep it."""
    local = setup.started_local
    if local is not None and not keep_cluster:
        setup.say(f"stopping the temporary local cluster (and {NAMESPACE} with it)")
        if setup.local_operator is not None:
            setup.local_operator.stop()
        local.stop(quiet=True)
        shutil.rmtree(local.directory, ignore_errors=True)
        return
    setup.say(f"cleaning up: deleting namespace {NAMESPACE} and the operator")
    remove(setup, wait=True)
    if local is not None:
        setup.say(f"leaving the local cluster running: export KUBECONFIG={local.kubeconfig}")
