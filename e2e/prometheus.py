"""A real Prometheus server in the loop (issue 34): it discovers and scrapes the operator on the
local cluster the way the chart's ServiceMonitor tells the Prometheus operator to, the worker
pods the way its PodMonitor does, and evaluates the chart's own alerting rules, so alerts are
seen firing in Prometheus itself.

The scrape config is derived from what the chart renders, never typed here: the ServiceMonitor
must select the operator's metrics Service (its matchLabels among the Service's labels, its port
among the Service's port names, its namespaceSelector naming the Service's namespace), and its
endpoint gives the path and honorLabels. Discovery goes through pods, not the Service's
endpoints: the local cluster maps pod IPs into 127/8 (e2e/cluster) and the API server refuses
loopback addresses in Endpoints (the controller-manager logs "may not be in the loopback
range"), so the Service never has any. The pods are therefore selected as the Service selects
them (its spec.selector, and the container port its targetPort names), and the target labels
are the ones the Prometheus operator sets (namespace, pod, service, job). A selector mistake in
the chart fails `check_selects` or leaves Prometheus with no target.

The rules are the rendered PrometheusRule's, with every `for:` set to 0s: how long a condition
must hold is unit-tested by promtool (tests/install/promtool/alerts_test.yaml); here the
expressions, labels and selectors meet a live operator's series.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import promtool
from e2e.promtool import Promtool, Rules

Obj = dict[str, Any]
SCRAPE_SECONDS = 1  # scrape and rule evaluation interval: the e2e waits on what they produce


def _label(name: str) -> str:
    """A Kubernetes label name as a discovery meta label's suffix (what Prometheus does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def check_selects(monitor: Obj, service: Obj) -> Obj:
    """The ServiceMonitor's endpoint, after checking it selects `service` (AssertionError says
    which part does not)."""
    spec, meta = monitor["spec"], service["metadata"]
    wanted = spec["selector"]["matchLabels"]
    labels = meta.get("labels") or {}
    missing = {k: v for k, v in wanted.items() if labels.get(k) != v}
    assert not missing, f"the ServiceMonitor selects labels the Service lacks: {missing}"
    names = spec.get("namespaceSelector", {}).get("matchNames", [])
    assert meta["namespace"] in names, (
        f"the ServiceMonitor looks in {names}, not {meta['namespace']}"
    )
    (endpoint,) = spec["endpoints"]
    ports = {p.get("name"): p for p in service["spec"]["ports"]}
    assert endpoint["port"] in ports, f"no Service port named {endpoint['port']}: {list(ports)}"
    return {**endpoint, "targetPort": ports[endpoint["port"]]["targetPort"]}


def _discovery(kubeconfig: Path, files: Path, namespaces: Obj) -> Obj:
    """Pod discovery through the API server of `kubeconfig` (its CA and token as files)."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    ca, token = files / "ca.crt", files / "token"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    token.write_text(user["token"])
    sd: Obj = {
        "role": "pod", "api_server": cluster["server"], "tls_config": {"ca_file": str(ca)},
        "authorization": {"credentials_file": str(token)},
    }  # fmt: skip
    if namespaces:
        sd["namespaces"] = namespaces
    return sd


def pod_monitor_config(monitor: Obj, kubeconfig: Path, files: Path) -> Obj:
    """One scrape job for the pods a PodMonitor selects, as the Prometheus operator writes it:
    its matchLabels and `In` expressions kept, the endpoint's port by container port name, its
    podTargetLabels copied onto every series."""
    spec, meta = monitor["spec"], monitor["metadata"]
    (endpoint,) = spec["podMetricsEndpoints"]
    sel = spec["selector"]
    keep = [
        {"source_labels": [f"__meta_kubernetes_pod_label_{_label(k)}"], "regex": re.escape(v),
         "action": "keep"}
        for k, v in sel.get("matchLabels", {}).items()
    ] + [
        {"source_labels": [f"__meta_kubernetes_pod_label_{_label(e['key'])}"],
         "regex": "|".join(re.escape(v) for v in e["values"]), "action": "keep"}
        for e in sel.get("matchExpressions", [])
        if e["operator"] == "In"
    ]  # fmt: skip
    assert len(keep) == len(sel.get("matchLabels", {})) + len(sel.get("matchExpressions", [])), (
        f"a selector operator this harness cannot express: {sel}"
    )
    names = spec.get("namespaceSelector", {}).get("matchNames")
    name = f"{meta['namespace']}/{meta['name']}"
    return {
        "job_name": f"podMonitor/{name}/0",
        "honor_labels": bool(endpoint.get("honorLabels")),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": f"{SCRAPE_SECONDS}s",
        "scrape_timeout": f"{SCRAPE_SECONDS}s",
        "kubernetes_sd_configs": [_discovery(kubeconfig, files, {"names": names} if names else {})],
        "relabel_configs": [
            *keep,
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": re.escape(str(endpoint["port"])), "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            *({"source_labels": [f"__meta_kubernetes_pod_label_{_label(k)}"],
               "target_label": _label(k)} for k in spec.get("podTargetLabels", [])),
            {"target_label": "job", "replacement": name},
        ],
    }  # fmt: skip


def scrape_config(monitor: Obj, service: Obj, kubeconfig: Path, files: Path) -> Obj:
    """One scrape job for what `monitor` selects, discovered through the Kubernetes API."""
    endpoint = check_selects(monitor, service)
    meta = service["metadata"]
    keep = [
        {"source_labels": [f"__meta_kubernetes_pod_label_{_label(k)}"], "regex": re.escape(v),
         "action": "keep"}
        for k, v in service["spec"]["selector"].items()
    ]  # fmt: skip
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{monitor['metadata']['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels")),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": f"{SCRAPE_SECONDS}s",
        "scrape_timeout": f"{SCRAPE_SECONDS}s",
        "kubernetes_sd_configs": [
            _discovery(kubeconfig, files, {"names": [meta["namespace"]]})
        ],
        "relabel_configs": [
            *keep,
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": re.escape(str(endpoint["targetPort"])), "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "service", "replacement": meta["name"]},
            {"target_label": "job", "replacement": meta["name"]},
        ],
    }  # fmt: skip


def without_for(rules: Rules) -> Rules:
    """The rules with every alert firing as soon as its expression holds."""
    out = copy.deepcopy(rules)
    for group in out["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    return out


class PrometheusServer:
    """A `prometheus` process over one scrape job and rule file, on a free loopback port."""

    def __init__(self, workdir: Path, port: int) -> None:
        # Built beside promtool (e2e/cluster/build-prometheus.sh): found the same way.
        self.binary = Path(Promtool.locate().path).with_name("prometheus")
        self.workdir, self.port = workdir, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, jobs: list[Obj], rules: Rules) -> None:
        (self.workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s",
                       "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(self.workdir / "rules.yaml")],
            "scrape_configs": jobs,
        }  # fmt: skip
        (self.workdir / "prometheus.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config.file={self.workdir / 'prometheus.yaml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited; log: {self.workdir}"
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in 60 s; log: {self.workdir}")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body.get("status") == "success", body
        return body["data"]

    def targets(self) -> list[Obj]:
        return list(self.api("targets", state="active")["activeTargets"])

    def query(self, expr: str) -> list[Obj]:
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[Obj]:
        return list(self.api("alerts")["alerts"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def pod_monitor_of_chart(helm: str) -> Obj:
    """The chart's worker PodMonitor as `helm template` renders it (any namespace)."""
    out = subprocess.run(
        [helm, "template", "pdw", str(promtool.CHART), "-n", "pdw-system",
         "--set", "metrics.podMonitor.enabled=true"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (monitor,) = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "PodMonitor"]
    return dict(monitor)


def screen_server(helm: str, kubeconfig: Path, workdir: Path, port: int) -> PrometheusServer:
    """A Prometheus scraping every worker pod the chart's PodMonitor selects, in every namespace
    of the cluster, every SCRAPE_SECONDS: what `pdwarden run --observe prometheus` screens."""
    server = PrometheusServer(workdir, port)
    job = pod_monitor_config(pod_monitor_of_chart(helm), kubeconfig, workdir)
    server.start([job], {"groups": []})
    return server
