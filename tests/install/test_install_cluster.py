"""`helm install` on a real control plane: the operator pod runs under its chart RBAC (not admin),
reconciles the CPU example, can do exactly what it needs, rolls on upgrade, and uninstalls clean.

The release watches one namespace so it never touches other tests' PDDeployments; a second,
cluster-wide release is installed with an unschedulable operator only to check its RBAC.
The tests share one release and run in file order. A real Prometheus (e2e/prometheus.py)
scrapes the release's operator as the chart's ServiceMonitor asks and evaluates the chart's
alerting rules while a wedge is repaired.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e import promtool
from e2e.cluster.controlplane import free_port
from e2e.fixtures import Cluster
from e2e.kubelet import memcg
from e2e.prometheus import PrometheusServer, pod_monitor_config, scrape_config, without_for
from e2e.promtool import rules_from_manifests

from pdwarden.constants import FINALIZER, LABEL_SERVING, WORKER_PORT

from .chart_helpers import CHART, ROOT, Helm, find

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
INSTANCE = "app.kubernetes.io/instance"


@dataclass
class Release:
    name: str
    namespace: str  # where the operator runs
    watched: str  # the one namespace it reconciles
    cluster: Cluster
    helm: Helm

    @property
    def sa(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-pdwarden"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.helm.run(*args, "-n", self.namespace, env=self.cluster.env, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def operator_pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l", f"{INSTANCE}={self.name}", "-o", "json"
        )
        pods: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def can_i(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        resource, _, sub = resource.partition("/")
        if sub:
            where.append(f"--subresource={sub}")
        out = self.cluster.kubectl(
            "auth", "can-i", verb, resource, f"--as={self.sa}", *where, check=False
        )
        assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
        return out.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def release(cluster: Cluster, crd: str, helm: Helm) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    rel = Release(f"pdw{suffix}", f"op-{suffix}", f"ws-{suffix}", cluster, helm)
    for ns in (rel.namespace, rel.watched):
        cluster.kubectl("create", "namespace", ns)
    rel.run(
        "install", rel.name, str(CHART), "--wait", "--timeout=120s",
        "--set", f"watchNamespaces={{{rel.watched}}},image.tag=dev,resyncSeconds=2",
    )  # fmt: skip
    yield rel
    rel.helm.run("uninstall", rel.name, "-n", rel.namespace, env=cluster.env)
    # Without an operator the finalizer would hold the PDDeployment (and the namespace) forever.
    for pdd in ("pd", "st"):
        cluster.kubectl(
            "patch", "pdd", pdd, "-n", rel.watched, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
    for ns in (rel.namespace, rel.watched):
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def prometheus(
    release: Release, cluster: Cluster, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """Prometheus over the release's operator: the scrape job derived from the ServiceMonitor
    and the metrics Service the chart renders for this release (the Service as installed), and
    the chart's alerting rules (every `for:` 0s, e2e/prometheus.py says why)."""
    rendered = helm.template(
        "--set", f"watchNamespaces={{{release.watched}}},image.tag=dev",
        "--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
        "--set", "metrics.podMonitor.enabled=true",
        release=release.name, namespace=release.namespace,
    )  # fmt: skip
    objs = [d for d in yaml.safe_load_all(rendered) if d]
    (monitor,) = find(objs, "ServiceMonitor")
    (pod_monitor,) = find(objs, "PodMonitor")
    (rendered_service,) = find(objs, "Service")
    service = json.loads(
        cluster.kubectl(
            "get", "service", rendered_service["metadata"]["name"], "-n", release.namespace,
            "-o", "json",
        ).stdout
    )  # fmt: skip
    work = tmp_path_factory.mktemp("prometheus")
    server = PrometheusServer(work, free_port())
    jobs = [
        scrape_config(monitor, service, Path(cluster.kubeconfig), work),
        pod_monitor_config(pod_monitor, Path(cluster.kubeconfig), work),
    ]
    server.start(jobs, without_for(rules_from_manifests(rendered)))
    yield server
    server.stop()


def pod_kubeconfig(cluster: Cluster, pod: dict[str, Any]) -> Path | None:
    """The kubeconfig the local kubelet gave the pod (None on another cluster)."""
    if cluster.local is None:
        return None
    meta = pod["metadata"]
    found = list(
        cluster.local.directory.glob(
            f"kubelet/pods/{meta['namespace']}/{meta['name']}/{meta['uid']}/kubeconfig"
        )
    )
    return found[0] if found else None


def test_operator_runs_as_its_service_account_and_reconciles_the_cpu_example(
    release: Release, cluster: Cluster
) -> None:
    (pod,) = release.operator_pods()
    assert pod["spec"]["serviceAccountName"] == f"{release.name}-pdwarden"
    kubeconfig = pod_kubeconfig(cluster, pod)
    if kubeconfig is not None:  # the identity the operator process really uses
        who = cluster.kubectl(f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json")
        assert json.loads(who.stdout)["status"]["userInfo"]["username"] == release.sa

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "minimal-cpu.yaml").read_text())
    doc["metadata"]["name"] = "pd"
    cluster.kubectl("apply", "-n", release.watched, "-f", "-", input=json.dumps(doc))

    def ready() -> Any:
        out = cluster.kubectl("get", "pdd", "pd", "-n", release.watched, "-o", "json")
        status = json.loads(out.stdout).get("status") or {}
        return status.get("phase") == "Ready" and status

    status = cluster.wait_until("PDDeployment pd Ready under the chart's RBAC", ready, 180)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded  # no ApplyFailed: nothing was forbidden
    # The admin Secret was created (create-only RBAC) and nothing else in the namespace is ours.
    secrets = cluster.kubectl("get", "secrets", "-n", release.watched, "-o", "name").stdout
    assert "secret/pd-admin" in secrets.split()
    # The worker NetworkPolicy as the API server holds it (no network plugin here enforces it):
    # the operator is admitted from its own namespace (the chart's POD_NAMESPACE), no peer from
    # every namespace.
    from pdwarden.render.network_policy import OPERATOR_POD_LABELS

    out = cluster.kubectl("get", "networkpolicy", "pd-workers", "-n", release.watched, "-o", "json")
    peers = [p for rule in json.loads(out.stdout)["spec"]["ingress"] for p in rule["from"]]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": release.namespace}},
        "podSelector": {"matchLabels": OPERATOR_POD_LABELS},
    } in peers, peers
    assert all(p.get("namespaceSelector", {"unset": ""}) != {} for p in peers), peers


def test_remediation_works_under_the_charts_rbac(
    release: Release, cluster: Cluster, prometheus: PrometheusServer
) -> None:
    """A stalled decode pod is cordoned and restarted by the in-cluster operator, using only the
    chart's RBAC and its derived admin token (it never reads the Secret it created). Prometheus
    scrapes the operator all along (the next test reads it); maxActionsPerHour 2 lets both
    actions through and then holds the circuit breaker open, for its alert."""
    from e2e.pdtools import (
        admin_token,
        apply,
        cpu_example,
        http,
        pods,
        recorded,
        router_url,
        status,
        wait_ready,
    )

    ns = release.watched
    fast = {"scrapeIntervalSeconds": 1, "wedgeAfterSeconds": 4, "restartAfterSeconds": 5,
            "cooldownSeconds": 2, "maxUnavailableDecode": 1, "maxActionsPerHour": 2}  # fmt: skip
    stall_env = [{"name": "PDWORKER_FAULTS", "value": "decode-stall"}]
    apply(cluster, ns, cpu_example("st", decode={"replicas": 2, "env": stall_env},
                                   remediation=fast))  # fmt: skip
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, name="st")
    victim = pods(cluster, ns, "decode", "st")[0]
    code, body = http(
        "POST", f"http://{victim['status']['podIP']}:{WORKER_PORT}/admin/decode-stall", {},
        token=admin_token(cluster, ns, "st"),
    )  # fmt: skip
    assert code == 200, body
    url = router_url(cluster, ns, "st")
    for i in range(16):  # some of these land on the stalled pod and hang there: time out
        with contextlib.suppress(TimeoutError, OSError):
            http("POST", url + "/generate", {"text": f"req {i}", "max_new_tokens": 2}, timeout=3)

    def restarted() -> Any:
        # Records only: the operator writes each action's intent (Pending) before acting, and a
        # RestartDecode intent is in status a moment before the restart's record replaces it.
        history = recorded((status(cluster, ns, "st").get("remediation") or {}).get("history")
                           or [])  # fmt: skip
        done = {e["action"]: e for e in history}
        return "RestartDecode" in done and "CordonDecode" in done and history

    history = cluster.wait_until("cordon and restart under chart RBAC", restarted, 90)
    assert all(e["outcome"] == "Succeeded" for e in history), history
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, name="st")
    new = next(
        p
        for p in pods(cluster, ns, "decode", "st")
        if p["metadata"]["name"] == victim["metadata"]["name"]
    )
    assert new["metadata"]["uid"] != victim["metadata"]["uid"]


def test_prometheus_scrapes_the_operator_and_fires_the_charts_alerts(
    release: Release, prometheus: PrometheusServer
) -> None:
    """After the repair above, in Prometheus itself: the operator pod is the one target the
    ServiceMonitor's selectors find, and up; the breaker's alert fires for the PDDeployment in
    its own namespace (the ServiceMonitor's honorLabels keeps the metric's `namespace`); the
    wedge alert fires in the operator's namespace; the alert that the operator is down, whose
    selector names the release's Service, does not."""
    (target,) = [t for t in prometheus.targets() if t["scrapePool"].startswith("serviceMonitor/")]
    labels = target["labels"]
    assert labels["namespace"] == release.namespace and labels["pod"].startswith(release.name)
    service = labels["service"]

    def firing() -> dict[str, list[dict[str, str]]]:
        out: dict[str, list[dict[str, str]]] = {}
        for a in prometheus.alerts():
            if a["state"] == "firing":
                out.setdefault(a["labels"]["alertname"], []).append(a["labels"])
        return out

    def both() -> dict[str, list[dict[str, str]]] | None:
        alerts = firing()
        wanted = ("PDWardenRemediationSuspended", "PDWardenWedgePersists")
        return alerts if all(a in alerts for a in wanted) else None

    alerts = release.cluster.wait_until("the breaker's and the wedge's alerts firing", both, 60)
    assert alerts is not None
    (suspended,) = alerts["PDWardenRemediationSuspended"]
    assert (suspended["kind"], suspended["namespace"], suspended["name"]) == (
        "PDDeployment", release.watched, "st"), suspended  # fmt: skip
    assert [a["namespace"] for a in alerts["PDWardenWedgePersists"]] == [release.namespace]
    assert "PDWardenDown" not in alerts
    up = prometheus.query(f'up{{namespace="{release.namespace}", service="{service}"}} == 1')
    assert len(up) == 1, up
    # The repair's own series, as Prometheus holds them: one decode cordoned and restarted.
    done = prometheus.query('sum by (action) (pdwarden_remediations_total{result="succeeded"}) > 0')
    assert {r["metric"]["action"]: float(r["value"][1]) for r in done} == {
        "CordonDecode": 1.0, "RestartDecode": 1.0}  # fmt: skip


# What each dashboard panel must show after the repair above, as Prometheus answers its queries:
# the labels its legend names (empty: one unlabelled series). Panels that count only faults may
# be empty in a healthy run; every other query must return series.
PANEL_LABELS = {
    "Wedged rooms": {"kind", "namespace", "name"},
    "Remediation suspended (circuit breaker)": {"kind", "namespace", "name"},
    "Actions by kind and outcome": {"action", "result"},
    "Time to remediate": set(),
    "New wedges by rule": {"reason"},
    "Scrape errors and refused bodies": set(),
    "Cycle duration": set(),
    "Contained operator errors by stage": {"stage"},
}
FAULT_FAMILIES = {"pdwarden_scrape_errors", "pdwarden_scrape_refused", "pdwarden_operator_errors"}


def test_every_dashboard_panel_shows_the_repair_in_prometheus(
    release: Release, prometheus: PrometheusServer
) -> None:
    """Each panel's queries, as Grafana would send them ($__rate_interval as a window that holds
    the repair), against the Prometheus that scraped the operator through it: PromQL the server
    accepts, series where the repair made some, and the legend's labels on them (the gauges'
    kind/namespace/name must survive the ServiceMonitor's honorLabels)."""
    panels = promtool.panel_exprs()
    titles = {key.split(": ", 1)[1] for key in panels}
    assert titles == set(PANEL_LABELS), "a dashboard panel this test does not judge"
    shown: dict[str, int] = {}
    for key, exprs in panels.items():
        title = key.split(": ", 1)[1]
        for expr in exprs:
            result = prometheus.query(expr.replace("$__rate_interval", promtool.RATE_INTERVAL))
            families = {promtool.family(n) for n in promtool.NAME.findall(expr)}
            if not result:
                assert families <= FAULT_FAMILIES, f"{title}: {expr} shows nothing"
                continue
            for series in result:
                labels = series["metric"]
                assert PANEL_LABELS[title] <= set(labels), (title, expr, labels)
                assert all(labels[k] for k in PANEL_LABELS[title]), (title, expr, labels)
            shown[expr] = len(result)
    suspended = prometheus.query("max by (kind, namespace, name) (pdwarden_remediation_suspended)")
    held = {(r["metric"]["namespace"], r["metric"]["name"]): r["value"][1] for r in suspended}
    assert held.get((release.watched, "st")) == "1", held
    print(f"[prometheus] dashboard queries with series: {len(shown)}", flush=True)


def test_an_operator_oom_killed_in_a_loop_repairs_a_live_wedge_once_when_its_limit_returns(
    release: Release, cluster: Cluster
) -> None:
    """The operator's memory limit set below what it needs (70% of the peak its container's
    cgroup measured so far), a decode stalled under load meanwhile: the kernel OOM-kills the
    operator in a loop (OOMKilled, CrashLoopBackOff). The limit restored, the wedge is cordoned
    and restarted once: wherever the kills fell, no action is lost, none done twice, no intent
    left Pending. (Measured: at 70% the kills fall while it imports, before it acts; an OOM
    kill is a SIGKILL, and one inside an action, at each of its three points, is
    e2e/tests/test_ledger_failover.py's.)"""
    from e2e.pdtools import admin_token, history, http, pods, router_url, wait_ready

    if cluster.local is None or not memcg.available():
        pytest.skip("needs the local kubelet and memory cgroups: limits are not enforced here")
    ns = release.watched
    (pod,) = release.operator_pods()
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
    cgroup = memcg.of_pid(pid)
    assert cgroup is not None and memcg.PARENT in str(cgroup.path), cgroup
    peak = cgroup.peak_bytes()
    low = int(peak * 0.7) >> 20
    before = {(e["action"], e.get("uid")) for e in history(cluster, ns, "st")}
    release.run(
        "upgrade", release.name, str(CHART), "--reuse-values",
        "--set", f"resources.limits.memory={low}Mi,resources.requests.memory={low}Mi",
    )  # fmt: skip

    # A new wedge while the operator dies: the breaker reopened for it, a decode stalled.
    cluster.kubectl("patch", "pdd", "st", "-n", ns, "--type=merge",
                    "-p", '{"spec":{"remediation":{"maxActionsPerHour":10}}}')  # fmt: skip
    victim = pods(cluster, ns, "decode", "st")[0]
    code, body = http(
        "POST", f"http://{victim['status']['podIP']}:{WORKER_PORT}/admin/decode-stall", {},
        token=admin_token(cluster, ns, "st"),
    )  # fmt: skip
    assert code == 200, body
    url = router_url(cluster, ns, "st")

    def oom_killed() -> int:
        kills = 0
        for p in release.operator_pods():
            (c,) = p["status"].get("containerStatuses") or [{}]
            last = (c.get("lastState") or {}).get("terminated") or {}
            if last.get("reason") == "OOMKilled" and f"{low}Mi" in json.dumps(p["spec"]):
                kills = max(kills, int(c.get("restartCount", 0)))
        return kills

    for i in range(16):  # some land on the stalled pod and hang there: time out
        with contextlib.suppress(TimeoutError, OSError):
            http("POST", url + "/generate", {"text": f"oom {i}", "max_new_tokens": 2}, timeout=3)
    kills = cluster.wait_until(
        "the operator OOM-killed twice", lambda: oom_killed() >= 2 and oom_killed(), 120
    )

    release.run(
        "upgrade", release.name, str(CHART), "--reuse-values", "--wait", "--timeout=120s",
        "--set", "resources.limits.memory=512Mi,resources.requests.memory=128Mi",
    )  # fmt: skip
    restored = time.monotonic()

    def repaired() -> list[dict[str, Any]] | None:
        entries = history(cluster, ns, "st")
        new = [e for e in entries if (e["action"], e.get("uid")) not in before]
        done = {(e["action"], e.get("uid")) for e in new if e["outcome"] == "Succeeded"}
        want = {("CordonDecode", victim["metadata"]["uid"]),
                ("RestartDecode", victim["metadata"]["uid"])}  # fmt: skip
        return new if want <= done else None

    new = cluster.wait_until("the wedge repaired once the limit is back", repaired, 120)
    took = time.monotonic() - restored
    keys = [(e["action"], e.get("uid")) for e in new]
    assert len(keys) == len(set(keys)) == 2, new  # each action once, nothing else
    assert all(e["outcome"] == "Succeeded" for e in new), new
    wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"}, name="st")
    print(
        f"[oom] peak {peak >> 20} MiB, limit {low}Mi: {kills} OOM kills; repaired "
        f"{took:.1f} s after the limit was restored",
        flush=True,
    )


def test_prometheus_scrapes_every_worker_pod_the_pod_monitor_selects(
    release: Release, cluster: Cluster, prometheus: PrometheusServer
) -> None:
    """The chart's PodMonitor, as Prometheus follows it: one target per prefill and decode pod
    of the watched namespace's PDDeployments (the router is no worker), each up, and the
    workers' own series labelled with their PDDeployment and role."""
    from e2e.pdtools import pods

    want = {
        p["metadata"]["name"]
        for name in ("pd", "st")
        for role in ("prefill", "decode")
        for p in pods(cluster, release.watched, role, name)
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }

    def scraped() -> set[str] | None:
        up = prometheus.query(f'up{{namespace="{release.watched}"}} == 1')
        names = {r["metric"]["pod"] for r in up}
        return names if names == want else None

    cluster.wait_until("every worker pod scraped by the PodMonitor's job", scraped, 60)
    series = prometheus.query(
        f'count by (pdwarden_dev_deployment, pdwarden_dev_role) '
        f'({{namespace="{release.watched}", __name__=~"pdworker_.+"}})'
    )  # fmt: skip
    got = {(r["metric"].get("pdwarden_dev_deployment"), r["metric"].get("pdwarden_dev_role"))
           for r in series}  # fmt: skip
    assert got == {(d, r) for d in ("pd", "st") for r in ("prefill", "decode")}, got


ALLOWED = [
    ("get", "pddeployments.pdwarden.dev"),
    ("list", "pddeployments.pdwarden.dev"),
    ("watch", "pddeployments.pdwarden.dev"),
    ("patch", "pddeployments.pdwarden.dev"),
    ("patch", "pddeployments.pdwarden.dev/status"),
    ("create", "statefulsets.apps"),
    ("patch", "statefulsets.apps"),
    ("watch", "statefulsets.apps"),
    ("list", "deployments.apps"),
    ("watch", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("create", "services"),
    ("patch", "serviceaccounts"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("patch", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "poddisruptionbudgets.policy"),
    ("create", "networkpolicies.networking.k8s.io"),
    ("patch", "networkpolicies.networking.k8s.io"),
    ("create", "secrets"),
    ("list", "pods"),
    ("watch", "pods"),
    ("delete", "pods"),
    ("patch", "pods/status"),
    ("create", "events"),
]
DENIED_IN_WATCHED = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("patch", "secrets"),
    ("create", "pods/exec"),
    ("create", "pods"),
    ("delete", "pddeployments.pdwarden.dev"),
    ("delete", "statefulsets.apps"),
    ("delete", "roles.rbac.authorization.k8s.io"),
    ("bind", "roles.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io"),
    ("get", "configmaps"),
    ("create", "leases.coordination.k8s.io"),
]
DENIED_CLUSTER_WIDE = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("list", "nodes"),
    ("patch", "nodes"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("delete", "namespaces"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "pods/exec"),
]


def test_service_account_can_do_what_it_needs_and_nothing_else(release: Release) -> None:
    ns, other = release.watched, release.namespace
    refused = [f"{v} {r}" for v, r in ALLOWED if not release.can_i(v, r, ns)]
    assert not refused, f"the operator needs but lacks in {ns}: {refused}"
    granted = [f"{v} {r}" for v, r in DENIED_IN_WATCHED if release.can_i(v, r, ns)]
    assert not granted, f"the operator holds more than it needs in {ns}: {granted}"
    granted = [f"{v} {r}" for v, r in DENIED_CLUSTER_WIDE if release.can_i(v, r)]
    assert not granted, f"the operator holds cluster-wide: {granted}"
    # Namespaced mode grants nothing outside the watched namespace (except CRD discovery).
    granted = [f"{v} {r}" for v, r in ALLOWED if release.can_i(v, r, other)]
    assert not granted, f"outside its watched namespace: {granted}"
    assert release.can_i("watch", "customresourcedefinitions.apiextensions.k8s.io")


@pytest.fixture(scope="module")
def wide(release: Release, cluster: Cluster, helm: Helm) -> Iterator[Release]:
    """A second, cluster-wide release; only its RBAC and admission policy are under test: its
    operator pod is unschedulable and never runs."""
    rel = Release(f"{release.name}w", release.namespace, "", cluster, helm)
    rel.run(
        "install", rel.name, str(CHART),
        "--set-string", "nodeSelector.pdwarden\\.dev/no-such-node=true",
        "--set", "metrics.service.enabled=false",
    )  # fmt: skip
    yield rel
    rel.helm.run("uninstall", rel.name, "--wait", "-n", rel.namespace, env=cluster.env)


def test_cluster_wide_release_rbac(release: Release, wide: Release) -> None:
    for ns in (release.watched, "default"):
        refused = [f"{v} {r}" for v, r in ALLOWED if not wide.can_i(v, r, ns)]
        assert not refused, f"cluster-wide operator lacks in {ns}: {refused}"
        granted = [f"{v} {r}" for v, r in DENIED_IN_WATCHED if wide.can_i(v, r, ns)]
        assert not granted, f"cluster-wide operator holds in {ns}: {granted}"
    granted = [f"{v} {r}" for v, r in DENIED_CLUSTER_WIDE if wide.can_i(v, r)]
    assert not granted, f"cluster-wide operator holds: {granted}"
    assert wide.can_i("list", "pods") and wide.can_i("create", "secrets")


def rendered(kind: str, namespace: str) -> dict[str, Any]:
    """One object exactly as the operator renders it for the CPU example (a made-up owner UID:
    server-side dry runs store nothing, so nothing is garbage-collected)."""
    from pdwarden.api import parse_spec
    from pdwarden.render import Owner, render_deployment

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "minimal-cpu.yaml").read_text())
    owner = Owner("adm", namespace, "6f1b7c2e-8a4d-4c1e-9b1a-000000000001")
    objs = render_deployment(owner, parse_spec(doc["spec"]))
    return next(o for o in objs if o["kind"] == kind)


def test_admission_policy_holds_the_cluster_wide_identity_to_owned_hardened_objects(
    release: Release, wide: Release, cluster: Cluster
) -> None:
    """RBAC lets the cluster-wide operator create StatefulSets everywhere, kube-system included;
    the chart's ValidatingAdmissionPolicy refuses, as the operator's own identity, what the
    operator never renders, and accepts what it does."""
    policy = f"{wide.name}-pdwarden-operator-writes"

    def create(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(
            "create", "--dry-run=server", f"--as={wide.sa}", "-o", "name", "-f", "-",
            input=json.dumps(obj), check=False,
        )  # fmt: skip

    def refused(obj: dict[str, Any], why: str) -> None:
        out = create(obj)
        assert out.returncode != 0, f"accepted: {why}"
        assert f"ValidatingAdmissionPolicy '{policy}'" in out.stderr, out.stderr
        assert why in out.stderr, out.stderr

    ns = release.watched
    assert wide.can_i("create", "statefulsets.apps", "kube-system")  # RBAC alone would allow
    for kind in ("StatefulSet", "Deployment", "Service", "ServiceAccount", "NetworkPolicy"):
        out = create(rendered(kind, ns))
        assert out.returncode == 0, f"{kind}: {out.stderr}"

    privileged = rendered("StatefulSet", "kube-system")
    container = privileged["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"] = {"privileged": True}
    refused(privileged, "may not write statefulsets in namespace kube-system")
    refused(rendered("StatefulSet", "kube-system"), "in namespace kube-system")
    privileged["metadata"]["namespace"] = ns
    refused(privileged, "may not have privileged containers")
    host = rendered("StatefulSet", ns)
    host["spec"]["template"]["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    refused(host, "may not mount hostPath volumes")
    host = rendered("StatefulSet", ns)
    host["spec"]["template"]["spec"]["hostNetwork"] = True
    refused(host, "may not use host namespaces")
    foreign = rendered("Deployment", ns)
    foreign["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    refused(foreign, "may only run as their deployment's own ServiceAccount")
    unowned = rendered("StatefulSet", ns)
    del unowned["metadata"]["ownerReferences"]
    refused(unowned, "owned by exactly one PDDeployment")
    # The operator's own pods, Events and PDDeployment status are not affected: the namespaced
    # release's operator reconciled and remediated under the same policy in the tests above.


def test_admission_policy_lets_policies_switch_only_the_cordon_label_and_evict(
    release: Release, wide: Release, cluster: Cluster
) -> None:
    """A PDRemediationPolicy acts on pods pdwarden does not own: the chart's admission policy
    lets the operator's identity flip the cordon label and evict there, and nothing else."""
    policy = f"{wide.name}-pdwarden-operator-writes"
    ns = release.watched
    name = "someone-elses-pod"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app": "sglang-decode", LABEL_SERVING: "true"}},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/decode:1"}],
                 "nodeSelector": {"pdwarden.dev/no-such-node": "true"}},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:

        def as_operator(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return cluster.kubectl(*args, f"--as={wide.sa}", input=stdin, check=False)

        def refused(out: subprocess.CompletedProcess[str]) -> None:
            assert out.returncode != 0, "accepted"
            assert f"ValidatingAdmissionPolicy '{policy}'" in out.stderr, out.stderr
            assert "may only switch a cordon label or evict" in out.stderr, out.stderr

        label = ("label", "--dry-run=server", "--overwrite", "-n", ns, f"pod/{name}")
        ok = as_operator(*label, "pdwarden.dev/serving=false")
        assert ok.returncode == 0, ok.stderr
        refused(as_operator(*label, "app=something-else"))
        refused(as_operator(*label, "pdwarden.dev/serving=false", "extra=1"))
        image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil:1"}]
        refused(as_operator("patch", "--dry-run=server", "-n", ns, f"pod/{name}",
                            "--type=json", "-p", json.dumps(image)))  # fmt: skip
        refused(as_operator("delete", "--dry-run=server", "-n", ns, f"pod/{name}"))
        eviction = {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"dryRun": ["All"]},
        }  # fmt: skip
        out = as_operator(
            "create", "--raw", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", "-f", "-",
            stdin=json.dumps(eviction),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    finally:
        cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)


def test_upgrade_with_changed_values_rolls_the_operator(release: Release, cluster: Cluster) -> None:
    (before,) = release.operator_pods()

    def key() -> str:
        out = cluster.kubectl(
            "get", "secret", f"{release.name}-pdwarden-token-key", "-n", release.namespace,
            "-o", "jsonpath={.data.key}",
        )  # fmt: skip
        return out.stdout

    key_before = key()
    release.run(
        "upgrade", release.name, str(CHART), "--reuse-values", "--wait", "--timeout=120s",
        "--set", "resyncSeconds=3",
    )  # fmt: skip
    pods = cluster.wait_until(
        "one new operator pod",
        lambda: (
            [p for p in release.operator_pods() if p["status"].get("phase") == "Running"]
            if len(release.operator_pods()) == 1
            else None
        ),
        60,
    )
    (after,) = pods
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert "--resync-seconds=3" in after["spec"]["containers"][0]["args"]
    assert key() == key_before  # the token key survives upgrades (lookup)


def test_uninstall_leaves_no_operator_objects_but_keeps_crd_and_pddeployments(
    release: Release, cluster: Cluster
) -> None:
    release.run("uninstall", release.name, "--wait", "--timeout=120s")
    sel = f"{INSTANCE}={release.name}"
    for ns in (release.namespace, release.watched):
        left = cluster.kubectl(
            "get", "deploy,pods,svc,sa,secrets,roles,rolebindings,networkpolicies",
            "-n", ns, "-l", sel, "-o", "name",
        ).stdout.split()  # fmt: skip
        assert not [o for o in left if "pod/" not in o], left
        cluster.wait_until(
            f"operator pods gone from {ns}",
            lambda ns=ns: (
                not cluster.kubectl("get", "pods", "-n", ns, "-l", sel, "-o", "name").stdout.strip()
                or None
            ),
            60,
        )
    left = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-l", sel, "-o", "name")
    assert not left.stdout.strip()
    # Helm never deletes crds/: the CRD and the user's PDDeployment (and its pools) remain.
    cluster.kubectl("get", "crd", "pddeployments.pdwarden.dev")
    pdd = json.loads(
        cluster.kubectl("get", "pdd", "pd", "-n", release.watched, "-o", "json").stdout
    )
    assert pdd["metadata"]["finalizers"] == [FINALIZER]
    cluster.kubectl("get", "statefulset", "pd-decode", "-n", release.watched)
