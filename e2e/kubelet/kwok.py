"""Fake GPU nodes for scale runs: K nodes driven by kwok instead of the local kubelet.

Why: the local kubelet runs real processes, so it cannot host thousands of pods; kwok fakes node
heartbeats and pod lifecycles (Running with a pod IP, no process) so the scheduler, controllers
and the operator can be measured at scale. Nodes carry the annotation `kwok.x-k8s.io/node=fake`
(kwok manages only those, the local kubelet only its own names), the label `type=kwok` and a
`kwok.x-k8s.io/node=fake:NoSchedule` taint so ordinary pods never land on them; scale workloads
add the matching toleration and nodeSelector (see `SCALE_POD_PLACEMENT`).

    python -m e2e.kubelet.kwok --kubeconfig .cluster/kubeconfig --nodes 100
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ANNOTATION = "kwok.x-k8s.io/node"
SCALE_POD_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}],
}


def fake_node(name: str, gpus: int, pods: int = 110, pod_cidr: str | None = None) -> dict[str, Any]:
    capacity = {"cpu": "32", "memory": "256Gi", "pods": str(pods)}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "taints": [{"key": ANNOTATION, "value": "fake", "effect": "NoSchedule"}]
    }
    if pod_cidr is not None:
        spec["podCIDR"], spec["podCIDRs"] = pod_cidr, [pod_cidr]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION: "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": str(bool(gpus)).lower(),
            },
        },
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": capacity},
    }


# kwok >= 0.8 needs its stages passed in (-c); we use the "fast" set shipped in kwok's own module
# (read from the Go module cache the binary was built from, not copied into this repository).
STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def loopback_cidrs(octet: int, first: int = 100) -> Callable[[int], str]:
    """Pod CIDRs for kwok nodes inside 127.0.0.0/8: node i gets 127.<octet>.<first + i>.0/24.

    kwok gives a pod an IP from its node's spec.podCIDR, so these pods' IPs are loopback
    addresses that a process on this machine can bind (the fleet bench serves each pod's
    /metrics there; nothing ever scrapes an address off this machine). `octet` is the local
    cluster's claimed pod-CIDR octet (e2e.cluster.octets.claim_octet), whose third octets below
    `first` belong to the local kubelet's nodes. The controller-manager cannot occupy a CIDR
    outside its --cluster-cidr: it logs an error for these nodes and leaves them alone (backing
    off), and would refuse to start while they exist, so they are deleted with the nodes.
    """
    if not 0 < octet < 256 or not 0 <= first < 256:
        raise ValueError(f"not a loopback /24 base: 127.{octet}.{first}.0")
    return lambda i: f"127.{octet}.{first + i}.0/24"


def stages_config(version: str = "v0.8.0") -> str:
    """kwok's default stages as one multi-document YAML."""
    modcache = os.environ.get("GOMODCACHE") or os.path.expanduser("~/go/pkg/mod")
    root = Path(modcache) / f"sigs.k8s.io/kwok@{version}/kustomize/stage"
    missing = [f for f in STAGE_FILES if not (root / f).exists()]
    if missing:
        raise SystemExit(f"kwok stages not found under {root}: run `make cluster-bin`")
    return "\n---\n".join((root / f).read_text() for f in STAGE_FILES)


def kwok_binary() -> str:
    found = sorted(glob.glob(os.path.expanduser("~/.cache/pdwarden/*/bin/kwok")))
    if not found:
        raise SystemExit("kwok not built: run `make cluster-bin`")
    return found[-1]


class KwokNodes:
    """Start kwok and create `count` fake nodes; `stop()` ends kwok and deletes the nodes."""

    def __init__(
        self,
        kubeconfig: str,
        count: int,
        *,
        gpus: int = 8,
        prefix: str = "kwok-gpu-",
        log_path: Path | None = None,
        kwok: str | None = None,
        pods: int = 110,
        pod_cidr: Callable[[int], str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.names = [f"{prefix}{i}" for i in range(count)]
        if pod_cidr is not None and count + 100 > 256:
            raise ValueError(f"{count} nodes do not fit in one loopback /16 of /24s")
        self.gpus = gpus
        self.pods = pods
        self.pod_cidr = pod_cidr
        self.log_path = log_path
        self.kwok = kwok or kwok_binary()
        self.proc: subprocess.Popen[bytes] | None = None
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]

    def start(self, ready_timeout: float = 120) -> float:
        """Returns seconds until every node was Ready."""
        t = time.monotonic()
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._config = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="kwok-stages-")  # noqa: SIM115
        self._config.write(stages_config())
        self._config.flush()
        self.proc = subprocess.Popen(
            [self.kwok, f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
             f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
             "--node-lease-duration-seconds=40", "--node-ip=127.0.0.1", "-c", self._config.name],
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
        for i, name in enumerate(self.names):
            cidr = self.pod_cidr(i) if self.pod_cidr is not None else None
            body = fake_node(name, self.gpus, self.pods, cidr)
            try:
                self.api.create_node(body, _request_timeout=30)  # type: ignore[arg-type]
            except ApiException as e:
                if e.status != 409:
                    raise
            self.api.patch_node_status(name, {"status": body["status"]}, _request_timeout=30)
        deadline = time.monotonic() + ready_timeout
        while self.ready() < len(self.names):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"kwok exited with {self.proc.returncode} (log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.ready()}/{len(self.names)} kwok nodes Ready")
            time.sleep(0.5)
        return time.monotonic() - t

    def ready(self) -> int:
        nodes: list[Any] = self.api.list_node(label_selector="type=kwok", _request_timeout=30).items
        mine = set(self.names)
        return sum(
            1 for n in nodes if n.metadata.name in mine and any(
                c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        )  # fmt: skip

    def stop(self, delete_nodes: bool = True) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if delete_nodes:
            for name in self.names:
                try:
                    self.api.delete_node(name, _request_timeout=30)
                except ApiException as e:
                    if e.status != 404:
                        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.kubelet.kwok", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (8)")
    p.add_argument("--prefix", default="kwok-gpu-")
    p.add_argument("--keep-nodes", action="store_true", help="do not delete the nodes on exit")
    a = p.parse_args(argv)
    nodes = KwokNodes(a.kubeconfig, a.nodes, gpus=a.gpus, prefix=a.prefix)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        took = nodes.start()
        print(
            f"kwok: {a.nodes} fake GPU nodes Ready in {took:.1f}s; Ctrl-C to stop", file=sys.stderr
        )
        while nodes.proc and nodes.proc.poll() is None:
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        nodes.stop(delete_nodes=not a.keep_nodes)


if __name__ == "__main__":
    sys.exit(main())
