"""A real engine pair that pdwarden did not create: the shape a PDRemediationPolicy watches.

Why: the engine tiers show a policy over stock pods another tool deploys (llm-d's plain
StatefulSets): the pod templates pdwarden would render for a PDDeployment of that engine, made
foreign (no owner, no pdwarden label, no readiness gate, no admin token; `app`/`role` labels
instead), beside headless Services, and a policy that selects them by those labels.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.enginepair import Preflight, wait_pods_gone
from e2e.fixtures import Cluster, OperatorProcess
from e2e.pdtools import apply, get_json, pod_condition, recorded
from e2e.policy_pool import open_namespace
from pdwarden.api import parse_spec
from pdwarden.constants import API_VERSION, POLICY_KIND
from pdwarden.render import Owner
from pdwarden.render.deployment import render_deployment

POLICY_CYCLES = "pdwarden_policy_cycles_total"


def foreign_pair(doc: dict[str, Any], app: str, ns: str) -> list[dict[str, Any]]:
    """The prefill and decode StatefulSets (and their headless Services) of PDDeployment `doc`,
    as a user runs them by hand."""
    spec = parse_spec(doc["spec"])
    out = []
    for obj in render_deployment(Owner(app, ns, str(uuid.uuid4())), spec):
        role = obj["metadata"]["name"].removeprefix(f"{app}-")
        if obj["kind"] not in ("StatefulSet", "Service") or role not in ("prefill", "decode"):
            continue
        labels = {"app": app, "role": role}
        obj["metadata"] = {"name": obj["metadata"]["name"], "labels": labels}
        if obj["kind"] == "Service":
            obj["spec"]["selector"] = labels
        else:
            obj["spec"]["selector"] = {"matchLabels": labels}
            template = obj["spec"]["template"]
            template["metadata"] = {"labels": labels}
            pod = template["spec"]
            pod.pop("readinessGates", None)
            # pdwarden's admin token: a user's pool has none.
            pod["volumes"] = [v for v in pod["volumes"] if "secret" not in v]
            names = {v["name"] for v in pod["volumes"]}
            for c in pod["containers"]:
                c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m["name"] in names]
        out.append(obj)
    assert len(out) == 4, [o["metadata"]["name"] for o in out]
    return out


def policy(app: str, engine: str, port: int, **remediation: Any) -> dict[str, Any]:
    """A PDRemediationPolicy over `foreign_pair`'s pods."""
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": app},
        "spec": {
            "engine": engine,
            "prefillSelector": {"matchLabels": {"app": app, "role": "prefill"}},
            "decodeSelector": {"matchLabels": {"app": app, "role": "decode"}},
            "metrics": {"port": port},
            "remediation": remediation,
        },
    }


class Foreign:
    """The foreign pair's pods and its policy's status, by the `app` label."""

    def __init__(self, cluster: Cluster, ns: str, operator: OperatorProcess, app: str) -> None:
        self.cluster, self.ns, self.operator, self.app = cluster, ns, operator, app

    def pod(self, role: str) -> dict[str, Any]:
        selector = f"app={self.app},role={role}"
        items = get_json(self.cluster, self.ns, "pods", "-l", selector)["items"]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 1, [p["metadata"]["name"] for p in items]
        return dict(live[0])

    def ip(self, role: str) -> str:
        return str(self.pod(role)["status"]["podIP"])

    def ready(self) -> bool:
        try:
            pods = [self.pod(r) for r in ("prefill", "decode")]
        except AssertionError:
            return False
        return all(pod_condition(p, "Ready").get("status") == "True" for p in pods)

    def status(self) -> dict[str, Any]:
        return dict((get_json(self.cluster, self.ns, "pdrp", self.app) or {}).get("status") or {})

    def ledger(self) -> list[dict[str, Any]]:
        return recorded(list((self.status().get("remediation") or {}).get("history") or []))


@contextlib.contextmanager
def deployed(
    cluster: Cluster,
    doc: dict[str, Any],
    the_policy: dict[str, Any],
    log: Path,
    *,
    startup_seconds: float,
    preflight: Preflight,
    wait_gone: float = 0,
) -> Iterator[Foreign]:
    """PDDeployment `doc`'s pair as foreign StatefulSets in a namespace of their own with an
    operator of its own, Ready and past the preflight (the rig's fault, said at once), then
    `the_policy` over them; all deleted afterwards (with `wait_gone`, its pods awaited gone)."""
    app = str(doc["metadata"]["name"])
    ns = open_namespace(cluster)
    op = OperatorProcess(cluster, [ns], log).start()
    try:
        for obj in foreign_pair(doc, app, ns):
            apply(cluster, ns, obj)
        pool = Foreign(cluster, ns, op, app)
        t0 = time.monotonic()
        cluster.wait_until(f"the foreign pair {app} Ready", pool.ready, startup_seconds)
        print(f"[{app}] foreign pair Ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
        broken = preflight(pool.ip("prefill"), pool.ip("decode"))
        if broken:
            pytest.fail(broken, pytrace=False)
        apply(cluster, ns, the_policy)
        yield pool
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if wait_gone:
            wait_pods_gone(cluster, ns, wait_gone)
