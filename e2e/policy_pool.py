"""A PD pool pdwarden did not create, and the PDRemediationPolicy over it, for e2e scenarios.

Why: the StatefulSet scenarios (e2e/tests/test_policy_scenarios.py) and the LeaderWorkerSet ones
(e2e/tests/test_policy_lws.py) drive the same user-side objects (pdworker pods with fault
switches, a router and a Service selecting the cordon label, Secrets) and read the same policy
status, ledger and Events; one module keeps that vocabulary in one place.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from e2e.fixtures import REPO_ROOT, Cluster, OperatorProcess, create_namespace, wait_established
from e2e.pdtools import apply, get_json, http, merge, pod_condition, recorded, scrape
from pdwarden.api import parse_spec
from pdwarden.constants import (
    API_VERSION,
    LABEL_SERVING,
    POLICY_CRD_NAME,
    POLICY_KIND,
    WORKER_PORT,
)
from pdwarden.render import Owner
from pdwarden.render.deployment import render_deployment
from pdworker import contract as c

POLICY_CRD = REPO_ROOT / "crds" / f"{POLICY_CRD_NAME}.yaml"
WEDGE_AFTER, RESTART_AFTER = 4, 5
APP = {"app": "sgl"}


class Pool:
    """A namespace, its operator and a pool pdwarden did not create (app/role labels on every
    pod); `selectors` replaces the policy's default app/role selectors."""

    def __init__(
        self, cluster: Cluster, ns: str, token: str, op: OperatorProcess, app: str = "sgl"
    ) -> None:
        self.cluster, self.ns, self.token, self.operator = cluster, ns, token, op
        self.app = app
        self.counts = {"prefill": 1, "decode": 2, "router": 1}  # Ready pods per role label
        self.selectors: dict[str, Any] = {}

    def pods(self, role: str) -> list[dict[str, Any]]:
        items = get_json(self.cluster, self.ns, "pods", "-l", f"app={self.app},role={role}")[
            "items"
        ]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def pod(self, name: str) -> dict[str, Any]:
        return dict(get_json(self.cluster, self.ns, "pod", name) or {})

    def policy(self, name: str = "sgl") -> dict[str, Any]:
        return dict(get_json(self.cluster, self.ns, "pdrp", name) or {})

    def status(self, name: str = "sgl") -> dict[str, Any]:
        return dict(self.policy(name).get("status") or {})

    def ledger(self, name: str = "sgl") -> list[dict[str, Any]]:
        """The policy's ledger records (Pending intents left out: e2e.pdtools.recorded)."""
        return recorded(list((self.status(name).get("remediation") or {}).get("history") or []))

    def events(self, reason: str) -> list[dict[str, Any]]:
        got = get_json(self.cluster, self.ns, "events", "--field-selector", f"reason={reason}")
        return list(got["items"])

    def router(self) -> str:
        ip = next(p["status"]["podIP"] for p in self.pods("router") if p["status"].get("podIP"))
        return f"http://{ip}:{WORKER_PORT}"

    def wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            for role, n in self.counts.items():
                up = [
                    p for p in self.pods(role)
                    if pod_condition(p, "Ready").get("status") == "True"
                    and not p["metadata"].get("deletionTimestamp")
                ]  # fmt: skip
                if len(up) != n:
                    return False
            return True

        self.cluster.wait_until(f"the pool Ready ({self.counts})", ready, timeout)

    def stall(self, pod: dict[str, Any]) -> None:
        url = f"http://{pod['status']['podIP']}:{WORKER_PORT}/admin/decode-stall"
        code, body = http("POST", url, {}, token=self.token)
        assert code == 200, body

    def load_onto(self, pod: dict[str, Any], tries: int = 5) -> None:
        """Send load through the router until the (stalled) decode `pod` holds rooms.

        The router picks a decode pod at random among those its discovery listed (refreshed
        every 2 s), so one load can miss a pod that was just recreated; fast workers finish 24
        requests before the next refresh. The pod's own queue gauges say when it has rooms."""
        url = f"http://{pod['status']['podIP']}:{WORKER_PORT}/metrics"
        queues = (c.DECODE_PREALLOC_QUEUE, c.DECODE_TRANSFER_QUEUE, c.DECODE_RUNNING)

        def held() -> bool:
            try:
                metrics = scrape(url)
            except OSError:  # gone: only a held room makes the policy restart a pod
                return True
            return sum(v for k, v in metrics.items() if k.split("{")[0] in queues) > 0

        for _ in range(tries):
            self.load()
            if held():
                return
        raise AssertionError(f"{tries} loads left no room on {pod['metadata']['name']}")

    def load(self, requests: int = 24) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "summary.json"
            out = subprocess.run(
                [str(Path(sys.executable).parent / "pdworker"), "load", "--url", self.router(),
                 "--json", str(path), "--clients", "4", "--requests", str(requests),
                 "--timeout", "8"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert path.exists(), out.stderr
            summary: dict[str, Any] = json.loads(path.read_text())
            return summary

    def generate(self, text: str) -> dict[str, Any]:
        code, answer = http(
            "POST", self.router() + "/generate", {"text": text, "max_new_tokens": 4}
        )
        assert isinstance(answer, dict), answer
        answer["http_status"] = code
        return answer

    def apply_policy(self, name: str = "sgl", **remediation: Any) -> None:
        doc = policy_doc(name, self.app, **remediation)
        doc["spec"].update(self.selectors)
        apply(self.cluster, self.ns, doc)

    def get_pdrp(self) -> str:
        return self.cluster.kubectl("get", "pdrp", "-n", self.ns, "-o", "wide").stdout


def policy_doc(name: str = "sgl", app: str = "sgl", **remediation: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "engine": "pdworker",
            "prefillSelector": {"matchLabels": {"app": app, "role": "prefill"}},
            "decodeSelector": {"matchLabels": {"app": app, "role": "decode"}},
            "metrics": {"port": WORKER_PORT},
            "remediation": {
                "mode": "DryRun", "scrapeIntervalSeconds": 1, "wedgeAfterSeconds": WEDGE_AFTER,
                "restartAfterSeconds": RESTART_AFTER, "cooldownSeconds": 2,
                "maxUnavailableDecode": 1, **remediation,
            },
            "cordon": {"serviceRef": {"name": f"{app}-serving"}},
            "adminTokenSecretRef": {"name": f"{app}-admin", "key": "token"},
        },
    }  # fmt: skip


def foreign_pool(ns: str, app: str = "sgl", **overrides: Any) -> list[dict[str, Any]]:
    """What a user runs without pdwarden: pdworker StatefulSets, a router, Services, Secrets.

    The pod templates are pdwarden's own rendering of a CPU pdworker pool (so the pods start as
    the PDDeployment's do, with the bootstrap key and admin token from Secrets), made foreign:
    no owner reference, no pdwarden label, no readiness gate; labels app/role instead, and the
    cordon label on decode pods, which the router's selector and the Service include.
    """
    doc = yaml.safe_load((REPO_ROOT / "manifests" / "examples" / "minimal-cpu.yaml").read_text())
    doc["spec"]["decode"]["env"] = [{"name": "PDWORKER_FAULTS", "value": "decode-stall"}]
    doc["spec"] = merge(doc["spec"], overrides)
    owner = Owner(app, ns, str(uuid.uuid4()))
    base = {"app": app}
    out = []
    for obj in render_deployment(owner, parse_spec(doc["spec"])):
        meta = obj["metadata"]
        meta.pop("ownerReferences", None)
        meta["labels"] = dict(base)
        kind = obj["kind"]
        if kind == "PodDisruptionBudget":
            continue
        role = meta["name"].removeprefix(f"{app}-")
        labels = {**base, "role": role}
        if kind == "Service":
            obj["spec"]["selector"] = labels
        if kind in ("StatefulSet", "Deployment"):
            obj["spec"]["selector"] = {"matchLabels": labels}
            template = obj["spec"]["template"]
            template["metadata"]["labels"] = labels | (
                {LABEL_SERVING: "true"} if role == "decode" else {}
            )
            template["metadata"].pop("annotations", None)
            template["spec"].pop("readinessGates", None)
            args = template["spec"]["containers"][0]["command"]
            if role in ("router", "decode"):  # decode dials only the prefills it selects
                args[args.index("--prefill-selector") + 1] = f"app={app},role=prefill"
            if role == "router":
                args[args.index("--decode-selector") + 1] = (
                    f"app={app},role=decode,{LABEL_SERVING}=true"
                )
        out.append(obj)
    out.append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{app}-serving", "labels": dict(base)},
        "spec": {"selector": {**base, "role": "decode", LABEL_SERVING: "true"},
                 "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": WORKER_PORT}]},
    })  # fmt: skip
    return out


def open_namespace(cluster: Cluster) -> str:
    """The PDRemediationPolicy CRD installed and Established, and a fresh namespace for a pool."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POLICY_CRD))
    wait_established(cluster, POLICY_CRD_NAME)
    return create_namespace(cluster, "p")


def start_pool(
    cluster: Cluster,
    ns: str,
    app: str,
    objects: list[dict[str, Any]] | None = None,
    **overrides: Any,
) -> str:
    """Secrets (admin token, KV bootstrap key) and the pool; returns the admin token."""
    token = secrets.token_urlsafe(32)
    for name, value in ((f"{app}-admin", token), (f"{app}-bootstrap", secrets.token_urlsafe(32))):
        apply(cluster, ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                            "stringData": {"token": value}})  # fmt: skip
    for obj in foreign_pool(ns, app, **overrides) if objects is None else objects:
        apply(cluster, ns, obj)
    return token


def hand_cordoned_pod_is_uncordoned(pool: Pool) -> None:
    """The scenario both owners share: a decode pod cordoned by hand (the label set to false) is
    uncordoned by an Enforce policy after a healthy window, in place (same uid, no restart)."""
    pool.wait_ready()
    pool.apply_policy(mode="Enforce")
    pod = pool.pods("decode")[0]
    name = pod["metadata"]["name"]
    pool.cluster.kubectl("label", "pod", name, "-n", pool.ns, f"{LABEL_SERVING}=false",
                         "--overwrite")  # fmt: skip

    def uncordoned() -> bool:
        return pool.pod(name)["metadata"]["labels"].get(LABEL_SERVING) == "true"

    pool.cluster.wait_until("the uncordon after a healthy window", uncordoned, WEDGE_AFTER + 30)
    last = [e for e in pool.ledger() if e["pod"] == name][-1]
    assert last["action"] == "UncordonDecode" and last["outcome"] == "Succeeded"
    assert pool.pod(name)["metadata"]["uid"] == pod["metadata"]["uid"]


def dry_run_only_reports(pool: Pool) -> dict[str, Any]:
    """Wait for the DryRun cordon a stalled decode earns, then check what a DryRun policy shows
    for it (every ledger entry DryRun, Wedged=True, a DryRunCordonDecode Event); the caller checks
    that its owner's pods are untouched. Returns the policy's status."""
    pool.cluster.wait_until(
        "a DryRun CordonDecode in the policy's ledger",
        lambda: any(e["action"] == "CordonDecode" and e["dryRun"] for e in pool.ledger()),
        WEDGE_AFTER + 30,
    )
    assert all(e["dryRun"] for e in pool.ledger())
    st = pool.status()
    assert next(c for c in st["conditions"] if c["type"] == "Wedged")["status"] == "True"
    assert pool.events("DryRunCordonDecode")
    print(pool.get_pdrp())
    return st
