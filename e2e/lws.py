"""LeaderWorkerSet's own controller (sigs.k8s.io/lws v0.9.0) run against the local test cluster.

Why: PDRemediationPolicy must work on pods a real LWS controller owns, labels and recreates, so
the e2e scenarios run LWS's real controller manager (built from its Go module by
e2e/cluster/build-lws.sh) rather than imitating its labels. What a Deployment of LWS would set up
with cert-manager or its internal cert rotation is done here by hand, on loopback:

- the CRDs from the module's config/crd/bases (LeaderWorkerSet and DisaggregatedSet: the manager
  watches both), applied with the cluster's kubectl, without the conversion webhook patch (one
  served version, nothing to convert);
- a CA and a serving certificate for 127.0.0.1 made with the openssl CLI at test time; the
  webhook server (config `webhook.host/port/certDir`, internal cert management off) serves them;
- the module's webhook configurations (config/webhook/manifests.yaml with its kustomize patches:
  the pod webhooks only for pods that carry `leaderworkerset.sigs.k8s.io/name`), pointing at
  `clientConfig.url: https://127.0.0.1:<port>/<path>` with that CA. The pod mutating webhook is
  what labels group pods (name, group-index, worker-index, group-key); without it the LWS
  controller cannot form groups;
- `--leader-elect=false`, metrics and health on free loopback ports.

RBAC: the manager runs with the test cluster's admin kubeconfig (system:masters), not with LWS's
ClusterRole; the scenarios test pdwarden's RBAC, not LWS's. The webhook URL is on the local
machine's loopback, so this only works with the local cluster (an external
PDWARDEN_E2E_KUBECONFIG API server could not call it).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from e2e.cluster.controlplane import REPO_ROOT
from e2e.cluster.processes import free_port
from e2e.fixtures import Cluster

LWS_VERSION = "v0.9.0"
BUILD_SCRIPT = REPO_ROOT / "e2e" / "cluster" / "build-lws.sh"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
DS_CRD = "disaggregatedsets.disaggregatedset.x-k8s.io"
# LWS's own pod labels (api/leaderworkerset/v1/leaderworkerset_types.go in v0.9.0).
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LABEL_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
# Webhooks of config/webhook/manifests.yaml after config/webhook/{mutating,validating}-patch.yaml:
# (name, path, group, resource, operations, only pods of an LWS).
MUTATING = [
    ("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
     "leaderworkerset.x-k8s.io", "leaderworkersets", ["CREATE", "UPDATE"], False),
    ("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"], True),
]  # fmt: skip
VALIDATING = [
    ("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
     "leaderworkerset.x-k8s.io", "leaderworkersets", ["CREATE", "UPDATE"], False),
    ("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"], True),
    ("vdisaggregatedset.kb.io", "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset",
     "disaggregatedset.x-k8s.io", "disaggregatedsets", ["CREATE", "UPDATE"], False),
]  # fmt: skip


def build_lws() -> Path:
    """Run build-lws.sh (a no-op when cached) and return the directory with lws-manager and
    crds/."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"building lws-manager {LWS_VERSION} failed (exit {out.returncode})")
    return Path(out.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_webhook_certs(directory: Path) -> bytes:
    """A throwaway CA and a serving cert for 127.0.0.1 (tls.crt/tls.key, the names
    controller-runtime's webhook server reads); returns the CA bundle in PEM."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", "/CN=pdwarden-e2e-lws-webhook-ca", cwd=d)  # fmt: skip
    (d / "tls.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out",
             "tls.csr", "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-sha256", "-extfile", "tls.ext",
             "-out", "tls.crt", cwd=d)  # fmt: skip
    (d / "ca.key").unlink()  # nothing else is ever signed with it
    return (d / "ca.crt").read_bytes()


def webhook_configs(name: str, port: int, ca: bytes) -> list[dict[str, Any]]:
    bundle = base64.b64encode(ca).decode()

    def hooks(table: list[tuple[str, str, str, str, list[str], bool]]) -> list[dict[str, Any]]:
        out = []
        for hook, path, group, resource, ops, pods_only in table:
            h: dict[str, Any] = {
                "name": hook, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
                "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ops,
                           "resources": [resource]}],
            }  # fmt: skip
            if pods_only:
                h["objectSelector"] = {
                    "matchExpressions": [{"key": LABEL_LWS_NAME, "operator": "Exists"}]
                }
            out.append(h)
        return out

    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
         "metadata": {"name": name}, "webhooks": hooks(table)}
        for kind, table in (("MutatingWebhookConfiguration", MUTATING),
                            ("ValidatingWebhookConfiguration", VALIDATING))
    ]  # fmt: skip


def _established(cluster: Cluster, crd: str) -> bool:
    path = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    return cluster.kubectl("get", "crd", crd, "-o", path, check=False).stdout == "True"


def _tls_up(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s, ctx.wrap_socket(s):
            return True
    except OSError:
        return False


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class LwsController:
    """lws-manager as a local process with its CRDs and webhooks registered on the cluster."""

    def __init__(self, cluster: Cluster, directory: Path) -> None:
        self.cluster, self.directory = cluster, directory
        self.name = f"pdwarden-e2e-lws-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "lws-manager.log"

    def start(self) -> LwsController:
        bin_dir = build_lws()
        for crd in sorted((bin_dir / "crds").glob("*.yaml")):
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        for crd in (LWS_CRD, DS_CRD):
            self.cluster.wait_until(f"CRD {crd} Established", lambda c=crd: _established(
                self.cluster, c))  # fmt: skip
        certs = self.directory / "certs"
        ca = make_webhook_certs(certs)
        webhook, metrics, health = free_port(), free_port(), free_port()
        config = self.directory / "lws-config.yaml"
        config.write_text(json.dumps({  # JSON is YAML; the decoder is strict about fields
            "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }))  # fmt: skip
        argv = [str(bin_dir / "lws-manager"), f"--config={config}", "--leader-elect=false"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=self.cluster.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self._wait("lws-manager /readyz and its webhook server", lambda: _healthy(health)
                   and _tls_up(webhook))  # fmt: skip
        for doc in webhook_configs(self.name, webhook, ca):
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
        return self

    def _wait(self, what: str, check: Any, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"lws-manager exited ({self.proc.returncode}): {self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not up after {timeout}s; log {self.log_path}")
            time.sleep(0.3)

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        """Webhook configurations first (failurePolicy Fail must not outlive the server), then
        the process (SIGTERM to its group, SIGKILL after a grace period)."""
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.cluster.kubectl("delete", kind, self.name, "--ignore-not-found", check=False)
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
