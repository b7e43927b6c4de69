"""Start and stop a real Kubernetes control plane on loopback, from binaries built by build.sh.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as local processes, plus the
project's Python kubelet (e2e.kubelet) that runs pods as processes. Everything a cluster owns
lives in one directory: PKI, etcd data, logs, a state file with the PIDs, and the admin
kubeconfig. `make cluster-up` uses `.cluster/` (its kubeconfig path is a contract); the test
suite starts its own cluster in a temporary directory so it never collides with one a user left
running.
"""

from __future__ import annotations

import json
import secrets
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster.octets import claim_octet, release_octet
from e2e.cluster.pki import Pki, make_pki
from e2e.cluster.processes import (
    STATE_FILE,
    ClusterError,
    free_port,
    log,
    pid_alive,
    reap,
    signal_group,
)
from e2e.cluster.readiness import ApiClient, http_ok, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "e2e" / "cluster" / "build.sh"
SERVICE_CIDR = "10.96.0.0/16"
# Stop order: the kubelet first so it can terminate its pods while the API server still answers.
STOP_ORDER = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
# What callers import from here; free_port and ClusterError live in processes.py now, and stay
# importable from here for e2e/fixtures.py.
__all__ = ["REPO_ROOT", "ClusterError", "LocalCluster", "build_binaries", "free_port"]


def build_binaries() -> Path:
    """Run build.sh (a no-op when the cache is warm) and return the directory of the binaries."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, text=True
    )
    if out.returncode != 0:
        raise ClusterError(f"building the control plane failed (exit {out.returncode})")
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class LocalCluster:
    """One local control plane rooted at `directory`."""

    directory: Path
    gpu_nodes: int = 2
    cpu_nodes: int = 1
    with_kubelet: bool = True
    # The second octet of the pod CIDR; the kubelet maps pod IP 10.X.N.K to 127.X.N.K, so two
    # clusters running at once must differ here. None: claim a free one (see claim_octet).
    pod_cidr_octet: int | None = None
    # Extra flags per component ("kube-apiserver", ...), appended to the defaults (fault tests).
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    # How each component was started, so a fault test can start one again (start_again).
    argv: dict[str, list[str]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    def logfile(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    # -- state -------------------------------------------------------------------------------

    def running_pids(self) -> dict[str, int]:
        if not self.state_path.exists():
            return {}
        state = json.loads(self.state_path.read_text())
        return {k: v for k, v in state.get("pids", {}).items() if pid_alive(v)}

    def _save_state(self, extra: dict[str, object]) -> None:
        self.state_path.write_text(json.dumps({"pids": self.pids, **extra}, indent=2))

    # -- start -------------------------------------------------------------------------------

    def start(self) -> None:
        alive = self.running_pids()
        if alive:
            raise ClusterError(
                f"a cluster is already running from {self.directory} "
                f"(pids {sorted(alive.values())}); stop it first with `make cluster-down`"
            )
        t0 = time.monotonic()
        bin_dir = build_binaries()
        log(f"binaries ready in {time.monotonic() - t0:.1f}s ({bin_dir})")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        pki = make_pki(self.directory / "pki")
        token = secrets.token_hex(16)
        (self.directory / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
        ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kcm", "sched")}
        saved = self.directory / "pod-cidr-octet"
        if (
            self.pod_cidr_octet is None
            and saved.exists()
            and (self.directory / "etcd-data").exists()
        ):
            # The nodes stored in etcd-data carry pod CIDRs from this octet: keep it.
            self.pod_cidr_octet = int(saved.read_text())
        if self.pod_cidr_octet is None:
            self.pod_cidr_octet = claim_octet(self.directory)
        saved.write_text(str(self.pod_cidr_octet))
        octet = self.pod_cidr_octet
        log(f"pod IPs from 127.{octet}.0.0/16 (pod CIDR 10.{octet}.0.0/16 mapped into 127/8)")
        try:
            self._start_all(bin_dir, pki, token, ports)
        except BaseException:
            self.stop(quiet=True)
            raise
        log(f"cluster up in {time.monotonic() - t0:.1f}s; KUBECONFIG={self.kubeconfig}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._launch(name, [*argv, *self.extra_args.get(name, [])], env)

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv[name] = argv
        out = self.logfile(name).open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
            env=env,
        )
        out.close()
        self.pids[name] = proc.pid
        self._save_state({})

    def _start_all(self, b: Path, pki: Pki, token: str, ports: dict[str, int]) -> None:
        d = self.directory
        t = time.monotonic()
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        self._spawn("etcd", [
            str(b / "etcd"), "--name=local", f"--data-dir={d / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ])  # fmt: skip
        took = wait_for(
            "etcd", lambda: http_ok(f"{etcd_url}/health"), 60, str(self.logfile("etcd"))
        )
        log(f"etcd ready in {took:.1f}s")

        server = f"https://127.0.0.1:{ports['apiserver']}"
        self._spawn("kube-apiserver", [
            str(b / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
            f"--cert-dir={d / 'pki'}", f"--tls-cert-file={pki.apiserver_crt}",
            f"--tls-private-key-file={pki.apiserver_key}", f"--client-ca-file={pki.ca_crt}",
            f"--token-auth-file={d / 'tokens.csv'}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--endpoint-reconciler-type=none", "--profiling=false", "--v=1",
        ])  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        took = wait_for(
            "kube-apiserver",
            lambda: http_ok(f"{server}/readyz", ctx=ctx),
            120,
            str(self.logfile("kube-apiserver")),
        )
        log(f"kube-apiserver ready in {took:.1f}s at {server}")
        self._write_kubeconfig(server, pki, token)

        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(b / "kube-controller-manager"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['kcm']}", "--leader-elect=false",
            f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_crt}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allocate-node-cidrs=true",
            f"--cluster-cidr=10.{self.pod_cidr_octet}.0.0/16", "--node-cidr-mask-size=24",
            "--use-service-account-credentials=true", "--v=1",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            str(b / "kube-scheduler"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['sched']}",
            "--leader-elect=false", "--v=1",
        ])  # fmt: skip
        api = ApiClient(server, token, ctx)
        took = wait_for(
            "kube-controller-manager (default ServiceAccount)",
            lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
            90,
            str(self.logfile("kube-controller-manager")),
        )
        log(f"kube-controller-manager and kube-scheduler up in {took:.1f}s")

        if self.with_kubelet:
            self._spawn("kubelet", [
                sys.executable, "-m", "e2e.kubelet", f"--kubeconfig={kc}",
                f"--state-dir={d / 'kubelet'}", f"--gpu-nodes={self.gpu_nodes}",
                f"--cpu-nodes={self.cpu_nodes}",
            ])  # fmt: skip
            want = self.gpu_nodes + self.cpu_nodes
            took = wait_for(
                f"{want} Ready nodes from the local kubelet",
                lambda: api.ready_nodes() >= want,
                90,
                str(self.logfile("kubelet")),
            )
            log(f"local kubelet: {want} nodes Ready in {took:.1f}s")
        self._save_state({"server": server, "ports": ports})
        log(f"control plane started in {time.monotonic() - t:.1f}s")

    def _write_kubeconfig(self, server: str, pki: Pki, token: str) -> None:
        import base64

        ca = base64.b64encode(pki.ca_crt.read_bytes()).decode()
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {"server": server, "certificate-authority-data": ca},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": token}}],
                    "contexts": [
                        {"name": "local", "context": {"cluster": "local", "user": "admin"}}
                    ],
                    "current-context": "local",
                },
                indent=2,
            )
        )
        self.kubeconfig.chmod(0o600)

    # -- faults (e2e/tests/test_control_plane_faults.py) --------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL one component (its process group) and reap it: a crash, no goodbye."""
        pid = self.pids[name]
        signal_group(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.05)
        reap(pid)

    def start_again(self, name: str) -> None:
        """Start a killed component again with the argv it first ran with; its readiness is
        the caller's to wait for."""
        if pid_alive(self.pids[name]):
            raise ClusterError(f"{name} (pid {self.pids[name]}) is still running")
        kept = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self._launch(name, self.argv[name])
        self._save_state({k: v for k, v in kept.items() if k != "pids"})  # server, ports

    def etcd_url(self) -> str:
        ports = json.loads(self.state_path.read_text())["ports"]
        return f"http://127.0.0.1:{ports['etcd']}"

    def pause(self, name: str) -> None:
        """SIGSTOP one component: its sockets stay open, nothing answers (a hung process)."""
        signal_group(self.pids[name], signal.SIGSTOP)

    def resume(self, name: str) -> None:
        signal_group(self.pids[name], signal.SIGCONT)

    # -- stop --------------------------------------------------------------------------------

    def stop(self, quiet: bool = False, grace: float = 20.0) -> None:
        pids = {**self.running_pids(), **{k: v for k, v in self.pids.items() if pid_alive(v)}}
        if not pids and not quiet:
            log(f"no cluster running from {self.directory}")
        for name in STOP_ORDER:
            pid = pids.get(name)
            if pid is None:
                continue
            signal_group(pid, signal.SIGCONT)  # a paused one (fault tests) could not stop
            signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while pid_alive(pid) and time.monotonic() < deadline:
                reap(pid)
                time.sleep(0.1)
            if pid_alive(pid):
                signal_group(pid, signal.SIGKILL)
            reap(pid)
            if not quiet:
                log(f"stopped {name} (pid {pid})")
        self.pids.clear()
        if self.state_path.exists():
            self.state_path.unlink()
        release_octet(self.directory)
