"""The operator as the chart runs it (its ServiceAccount, RBAC and admission policy), and the
requests that identity sends, counted by the API server itself, by verb and resource.

Why: "how many requests does the operator send" must come from the API server, not from the
operator's own counters. `apiserver_request_total` has no user or user-agent label (it had one,
`client`, until Kubernetes 1.14), so the count comes from API Priority and Fairness instead:
one FlowSchema per (verb, resource) that matches only the operator's ServiceAccount, all on
the priority level a ServiceAccount's requests get anyway (`workload-low`), and the API server's
`apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}` counts each. A WATCH counts
once, when it is opened.

The identity: `helm template` of the chart's ServiceAccount, RBAC and ValidatingAdmissionPolicy
(cluster-wide, or namespaced with `namespaces`), a token for it from the TokenRequest API, and a
kubeconfig with that token. Everything cluster-scoped is named with a random suffix and deleted
by `close()`.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Final

import yaml

from e2e.cluster.controlplane import REPO_ROOT
from pdwarden.constants import GROUP, PLURAL

CHART = REPO_ROOT / "helm" / "pdwarden"
KUBE_VERSION = "1.35.4"  # the local cluster's; VAP templates need >= 1.30
CHART_PARTS = ("serviceaccount.yaml", "rbac.yaml", "rbac-policies.yaml", "admissionpolicy.yaml")
VERBS: Final = ("get", "list", "watch", "create", "patch", "update", "delete")
# (API group, resource[/subresource]); "*" last: whatever else the identity touches.
RESOURCES: Final = (
    ("", "pods"), ("", "pods/status"), ("apps", "statefulsets"), ("apps", "deployments"),
    ("", "events"), ("", "secrets"), (GROUP, PLURAL), (GROUP, f"{PLURAL}/status"), ("*", "*"),
)  # fmt: skip
METRIC = "apiserver_flowcontrol_dispatched_requests_total"
PRIORITY_LEVEL = "workload-low"


class Kubectl:
    def __init__(self, kubectl: str, kubeconfig: str) -> None:
        self.argv = [kubectl, f"--kubeconfig={kubeconfig}"]

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        out = subprocess.run(
            [*self.argv, *args], input=input, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        if check and out.returncode:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {out.stderr.strip()[:500]}")
        return out.stdout


def slug(resource: str) -> str:
    return resource.replace("/", "-").replace("*", "other")


class OperatorIdentity:
    """The chart's identity for the operator, plus per-verb request counting for it."""

    def __init__(
        self,
        kubectl: Kubectl,
        helm: str,
        directory: Path,
        *,
        namespace: str,
        watch_namespaces: tuple[str, ...] = (),
    ) -> None:
        self.kubectl, self.helm, self.directory = kubectl, helm, directory
        self.namespace = namespace
        self.release = f"fleet{uuid.uuid4().hex[:6]}"
        self.watch_namespaces = watch_namespaces
        self.prefix = f"pdw-count-{self.release}"
        self.objects: list[dict[str, Any]] = []
        self.sa = f"{self.release}-pdwarden"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.sa}"

    def create(self, admin_kubeconfig: str) -> str:
        """Apply the chart's identity and the FlowSchemas; returns the operator's kubeconfig."""
        self.kubectl("create", "namespace", self.namespace, check=False)
        args = [self.helm, "template", self.release, str(CHART), "-n", self.namespace,
                "--kube-version", KUBE_VERSION]  # fmt: skip
        for part in CHART_PARTS:
            args += ["--show-only", f"templates/{part}"]
        if self.watch_namespaces:
            args += ["--set", "watchNamespaces={" + ",".join(self.watch_namespaces) + "}"]
        rendered = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
        self.objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        self.objects += self.flow_schemas()
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": self.objects}))  # fmt: skip
        token = self.kubectl("create", "token", self.sa, "-n", self.namespace, "--duration=6h")
        config = json.loads(Path(admin_kubeconfig).read_text())
        config["users"] = [{"name": "operator", "user": {"token": token.strip()}}]
        for ctx in config["contexts"]:
            ctx["context"]["user"] = "operator"
        path = self.directory / "operator.kubeconfig"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return str(path)

    def flow_schemas(self) -> list[dict[str, Any]]:
        subject = {"kind": "ServiceAccount",
                   "serviceAccount": {"name": self.sa, "namespace": self.namespace}}  # fmt: skip
        out = []
        for i, (verb, (group, resource)) in enumerate(
            (v, r) for r in RESOURCES for v in (*VERBS, "*")
        ):
            rule = {"verbs": [verb], "apiGroups": [group], "resources": [resource],
                    "clusterScope": True, "namespaces": ["*"]}  # fmt: skip
            out.append(self._schema(f"{verb}-{slug(resource)}".replace("*", "other"), 1000 + i,
                                    {"subjects": [subject], "resourceRules": [rule]}))  # fmt: skip
        out.append(self._schema("nonresource", 1999, {"subjects": [subject], "nonResourceRules": [
            {"verbs": ["*"], "nonResourceURLs": ["*"]}]}))  # fmt: skip
        return out

    def _schema(self, name: str, precedence: int, rule: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": f"{self.prefix}-{name}"},
            "spec": {"matchingPrecedence": precedence,
                     "priorityLevelConfiguration": {"name": PRIORITY_LEVEL},
                     "distinguisherMethod": {"type": "ByUser"}, "rules": [rule]},
        }  # fmt: skip

    def counts(self) -> Counter[str]:
        """Requests dispatched so far for the identity, by "verb resource" (since the
        FlowSchemas exist; a difference of two calls is what happened in between)."""
        text = self.kubectl("get", "--raw", "/metrics")
        out: Counter[str] = Counter()
        marker = f'flow_schema="{self.prefix}-'
        for line in text.splitlines():
            if line.startswith(METRIC) and marker in line:
                name = line.split(marker, 1)[1].split('"', 1)[0]
                out[name.replace("-", " ", 1)] += int(float(line.rsplit(" ", 1)[1]))
        return out

    def close(self) -> None:
        """Delete what `create` made outside the namespace (FlowSchemas, cluster RBAC, the
        admission policy); the namespace itself is the caller's."""
        for obj in reversed(self.objects):
            if obj.get("metadata", {}).get("namespace"):
                continue
            self.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found",
                         "--wait=false", check=False)  # fmt: skip


def rates(before: Counter[str], after: Counter[str], seconds: float) -> dict[str, float]:
    """Requests per second by "verb resource" between two `counts()`, nonzero only."""
    return {k: round((after[k] - before[k]) / seconds, 3) for k in sorted(after)
            if after[k] - before[k] > 0}  # fmt: skip


def by_verb(before: Counter[str], after: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for key in after:
        out[key.split(" ", 1)[0]] += after[key] - before[key]
    return +out
