"""The chart's admission policy keeps the operator's identity to the router RBAC it renders.

RBAC lets the operator grant, in a Role it writes, any rule it holds itself (pods delete, secrets
create, statefulsets create and patch, ...) and lets it write pod templates that run as any
ServiceAccount of a namespace it writes. So a stolen operator identity could widen a router's
Role, or bind it to another account, and run a workload under it. The chart's
ValidatingAdmissionPolicy (templates/admissionpolicy.yaml) admits, from that identity, only what
render/deployment.py writes: one ServiceAccount and Role per deployment, `<name>-router`, whose
rules are exactly pods get/list/watch, bound to exactly that account; the router's Deployment
runs as it, the prefill StatefulSet as no account of its own and without its token, the decode
StatefulSet so too or as the router's account (a pdworker decode lists its prefill pods).

Every case here goes to the real kube-apiserver as the cluster-wide operator's ServiceAccount
with --dry-run=server (nothing is stored); a refusal must come from the policy and say why. The
release's operator pod is unschedulable and never runs: only its RBAC and policy are under test.
"""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from e2e.fixtures import Cluster

from .chart_helpers import CHART, ROOT, Helm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
OWNER_UID = "6f1b7c2e-8a4d-4c1e-9b1a-000000000002"  # made up: dry runs store nothing
GATEWAYS = [
    {"podSelector": {"matchLabels": {"app": "gateway"}}},
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}},
     "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["epp"]}]}},
]  # fmt: skip


@dataclass
class Operator:
    cluster: Cluster
    sa: str  # the operator's username
    policy: str  # the ValidatingAdmissionPolicy's name
    home: str  # the release (operator) namespace
    namespace: str  # where the PDDeployment's children are written

    def dry_run(self, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            "create", "--dry-run=server", f"--as={self.sa}", "-o", "json", "-f", "-",
            input=json.dumps(obj), check=False,
        )  # fmt: skip

    def refused(self, obj: dict[str, Any], why: str) -> None:
        out = self.dry_run(obj)
        what = f"{obj['kind']} {obj['metadata']['name']}"
        assert out.returncode != 0, f"accepted: {what} ({why})"
        assert f"ValidatingAdmissionPolicy '{self.policy}'" in out.stderr, out.stderr
        assert why in out.stderr, out.stderr


@pytest.fixture(scope="module")
def operator(cluster: Cluster, crd: str, helm: Helm) -> Iterator[Operator]:
    suffix = uuid.uuid4().hex[:6]
    name, home, target = f"adm{suffix}", f"adm-op-{suffix}", f"adm-ws-{suffix}"
    for ns in (home, target):
        cluster.kubectl("create", "namespace", ns)
    out = helm.run(
        "install", name, str(CHART), "-n", home,
        "--set-string", "nodeSelector.pdwarden\\.dev/no-such-node=true",
        "--set", "metrics.service.enabled=false",
        env=cluster.env, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    sa = f"system:serviceaccount:{home}:{name}-pdwarden"
    yield Operator(cluster, sa, f"{name}-pdwarden-operator-writes", home, target)
    helm.run("uninstall", name, "--wait", "-n", home, env=cluster.env)
    for ns in (home, target):
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def rendered(op: Operator, example: str, name: str = "adm", **patch: Any) -> list[dict[str, Any]]:
    """Every object the operator renders for an example, owned by deployment `name`."""
    from pdwarden.api import parse_spec
    from pdwarden.render import Owner, render_deployment

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / example).read_text())
    owner = Owner(name, op.namespace, OWNER_UID)
    return render_deployment(owner, parse_spec({**doc["spec"], **patch}), op.home)


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return copy.deepcopy(found)


def ensure_role(op: Operator, role: dict[str, Any]) -> None:
    """A RoleBinding can only be made to an existing Role: the admin creates it (not matched by
    the policy), without the made-up owner the garbage collector would delete it for."""
    role = copy.deepcopy(role)
    del role["metadata"]["ownerReferences"]
    op.cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(role))


def test_everything_the_operator_renders_passes(operator: Operator) -> None:
    for name, example in (("cpu", "minimal-cpu.yaml"), ("sgl", "sglang.yaml")):
        objs = rendered(operator, example, name, network={"allowFrom": GATEWAYS})
        assert [o["kind"] for o in objs].index("Role") < [o["kind"] for o in objs].index(
            "RoleBinding"
        )
        for obj in objs:
            out = operator.dry_run(obj)
            assert out.returncode == 0, f"{example} {obj['kind']}: {out.stderr}"
            if obj["kind"] == "Role":  # what the RoleBinding after it refers to
                ensure_role(operator, obj)
            if obj["kind"] == "NetworkPolicy":  # held as rendered: allowFrom peers included
                assert json.loads(out.stdout)["spec"] == obj["spec"]


def test_a_widened_router_role_is_refused(operator: Operator) -> None:
    """Each widening is something the operator holds itself, so RBAC alone would grant it."""
    role = one(rendered(operator, "minimal-cpu.yaml"), "Role")
    why = "grant exactly what its router's discovery needs: one rule, pods get, list and watch"
    more_verbs = copy.deepcopy(role)
    more_verbs["rules"][0]["verbs"].append("delete")
    operator.refused(more_verbs, why)
    more_rules = copy.deepcopy(role)
    more_rules["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
    operator.refused(more_rules, why)
    workloads = copy.deepcopy(role)
    workloads["rules"][0] = {"apiGroups": ["apps"], "resources": ["statefulsets"],
                             "verbs": ["get", "list", "create", "patch"]}  # fmt: skip
    operator.refused(workloads, why)
    cordon = copy.deepcopy(role)
    cordon["rules"].append({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]})
    operator.refused(cordon, why)
    second = copy.deepcopy(role)
    second["metadata"]["name"] = "adm-extra"
    operator.refused(second, "only writes the roles named adm-router, for the router")


def test_the_router_role_binds_only_its_own_account(operator: Operator) -> None:
    objs = rendered(operator, "minimal-cpu.yaml")
    ensure_role(operator, one(objs, "Role"))
    binding = one(objs, "RoleBinding")
    why = "binds its router's Role (<deployment>-router) to exactly its router's ServiceAccount"
    worker = copy.deepcopy(binding)
    worker["subjects"][0]["name"] = "adm-decode"
    operator.refused(worker, why)
    extra = copy.deepcopy(binding)
    extra["subjects"].append({"kind": "ServiceAccount", "name": "adm-router-2",
                              "namespace": operator.namespace})  # fmt: skip
    operator.refused(extra, why)
    elsewhere = copy.deepcopy(binding)
    elsewhere["subjects"][0]["namespace"] = operator.home
    operator.refused(elsewhere, why)
    other_role = copy.deepcopy(one(objs, "Role"))
    other_role["metadata"]["name"] = "adm-other"
    ensure_role(operator, other_role)
    rebound = copy.deepcopy(binding)
    rebound["roleRef"]["name"] = "adm-other"
    operator.refused(rebound, why)


def test_only_the_router_service_account_is_written(operator: Operator) -> None:
    account = one(rendered(operator, "minimal-cpu.yaml"), "ServiceAccount")
    account["metadata"]["name"] = "adm-prefill"
    operator.refused(account, "only writes the serviceaccounts named adm-router, for the router")


def test_pod_templates_run_only_as_the_account_rendered_for_their_kind(
    operator: Operator,
) -> None:
    objs = rendered(operator, "minimal-cpu.yaml")
    why = "may only run as their deployment's own ServiceAccount for their kind"

    def prefill() -> dict[str, Any]:
        return one(objs, "StatefulSet", "adm-prefill")

    def decode() -> dict[str, Any]:
        return one(objs, "StatefulSet", "adm-decode")

    def router() -> dict[str, Any]:
        return one(objs, "Deployment", "adm-router")

    assert decode()["spec"]["template"]["spec"]["serviceAccountName"] == "adm-router"
    for account in ("default", "adm-prefill"):  # the router's account or none, nothing else
        elsewhere = decode()
        elsewhere["spec"]["template"]["spec"]["serviceAccountName"] = account
        operator.refused(elsewhere, why)

    as_router = prefill()
    as_router["spec"]["template"]["spec"]["serviceAccountName"] = "adm-router"
    operator.refused(as_router, why)
    with_token = prefill()
    with_token["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    operator.refused(with_token, why)
    as_default = router()
    del as_default["spec"]["template"]["spec"]["serviceAccountName"]
    operator.refused(as_default, why)
    projected = {"name": "token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}}  # fmt: skip
    for workload in (prefill(), decode(), router()):
        workload["spec"]["template"]["spec"]["volumes"].append(projected)
        operator.refused(workload, "may not project ServiceAccount tokens")
