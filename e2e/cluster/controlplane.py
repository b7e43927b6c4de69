"""Start and stop a real Kubernetes control plane on loopback, from binaries built by build.sh.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as local processes, plus the
project's Python kubelet (e2e.kubelet) that runs pods as processes. Everything a cluster owns
lives in one directory: PKI, etcd data, logs, a state file with the PIDs, and the admin
kubeconfig. `make cluster-up` uses `.cluster/` (its kubeconfig path is a contract); the test
suite starts its own cluster in a temporary directory so it never collides with one a user left
running.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster.pki import Pki, make_pki

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "e2e" / "cluster" / "build.sh"
SERVICE_CIDR = "10.96.0.0/16"
STATE_FILE = "state.json"
# Stop order: the kubelet first so it can terminate its pods while the API server still answers.
STOP_ORDER = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


class ClusterError(RuntimeError):
    """The control plane could not be started or reached; the message says which part and why."""


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_binaries() -> Path:
    """Run build.sh (a no-op when the cache is warm) and return the directory of the binaries."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, text=True
    )
    if out.returncode != 0:
        raise ClusterError(f"building the control plane failed (exit {out.returncode})")
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float, proc_name: str = "") -> float:
    """Poll `check` until it is true; return the seconds it took or raise with the reason."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.25)
    hint = f"; see its log {proc_name}" if proc_name else ""
    raise ClusterError(f"{what} was not ready after {timeout:.0f}s{hint}")


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
    pids: dict[str, int] = field(default_factory=dict)

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
            "etcd", lambda: _http_ok(f"{etcd_url}/health"), 60, str(self.logfile("etcd"))
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
            lambda: _http_ok(f"{server}/readyz", ctx=ctx),
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

    # -- stop --------------------------------------------------------------------------------

    def stop(self, quiet: bool = False, grace: float = 20.0) -> None:
        pids = {**self.running_pids(), **{k: v for k, v in self.pids.items() if pid_alive(v)}}
        if not pids and not quiet:
            log(f"no cluster running from {self.directory}")
        for name in STOP_ORDER:
            pid = pids.get(name)
            if pid is None:
                continue
            _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while pid_alive(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if pid_alive(pid):
                _signal_group(pid, signal.SIGKILL)
            _reap(pid)
            if not quiet:
                log(f"stopped {name} (pid {pid})")
        self.pids.clear()
        if self.state_path.exists():
            self.state_path.unlink()
        release_octet(self.directory)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
        return bool(resp.status == 200)


@dataclass
class ApiClient:
    """Just enough of an API client to wait for the cluster; tests use kubectl or kubernetes."""

    server: str
    token: str
    ctx: ssl.SSLContext

    def get(self, path: str) -> dict[str, object] | None:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.ctx) as resp:
                data: dict[str, object] = json.loads(resp.read())
                return data
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def ready_nodes(self) -> int:
        nodes = self.get("/api/v1/nodes") or {}
        count = 0
        for node in nodes.get("items", []):  # type: ignore[attr-defined]
            for cond in node.get("status", {}).get("conditions", []):
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    count += 1
        return count


OCTETS_DIR = Path(os.environ.get("PDWARDEN_CACHE", Path.home() / ".cache" / "pdwarden")) / "octets"
OCTET_RANGE = range(100, 250)


def _octet_owner_alive(lock: Path) -> bool:
    """A claim is live while the cluster that made it still has its state file and processes."""
    try:
        directory = Path(lock.read_text().strip())
    except OSError:
        return False
    state = directory / STATE_FILE
    if not state.exists():
        return False
    try:
        pids = json.loads(state.read_text()).get("pids", {})
    except ValueError:
        return False
    return any(pid_alive(pid) for pid in pids.values())


def octets_in_use() -> set[int]:
    """Second octets of 127.X.y.z addresses that local sockets are bound to right now."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            addr = line.split()[1].split(":")[0]  # little-endian hex IPv4
            if len(addr) == 8 and int(addr[6:8], 16) == 127:
                used.add(int(addr[4:6], 16))
    return used


def claim_octet(directory: Path) -> int:
    """Claim a pod-CIDR octet no other running local cluster uses (244 first, then random)."""
    OCTETS_DIR.mkdir(parents=True, exist_ok=True)
    candidates = [244, *random.sample(list(OCTET_RANGE), len(OCTET_RANGE))]
    busy = octets_in_use()
    for octet in candidates:
        lock = OCTETS_DIR / str(octet)
        if octet in busy or (lock.exists() and _octet_owner_alive(lock)):
            continue
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            lock.unlink(missing_ok=True)  # stale claim: its cluster is gone
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(directory))
        return octet
    raise ClusterError("every pod-CIDR octet is claimed by a running local cluster")


def release_octet(directory: Path) -> None:
    if not OCTETS_DIR.is_dir():
        return
    for lock in OCTETS_DIR.iterdir():
        try:
            if Path(lock.read_text().strip()) == directory:
                lock.unlink(missing_ok=True)
        except OSError:
            continue
