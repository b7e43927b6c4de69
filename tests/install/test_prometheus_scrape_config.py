"""The scrape job e2e/prometheus.py derives from the chart (the live check is in
test_install_cluster.py): it follows the ServiceMonitor and the metrics Service the chart
renders, and a ServiceMonitor that would select nothing is refused before Prometheus starts."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from e2e.prometheus import check_selects, pod_monitor_config, scrape_config

from .chart_helpers import Helm, find

KUBECONFIG = {
    "clusters": [{"cluster": {"server": "https://127.0.0.1:6443",
                              "certificate-authority-data": "Y2E="}}],
    "users": [{"user": {"token": "t0ken"}}],
}  # fmt: skip


@pytest.fixture(scope="module")
def chart(helm: Helm) -> tuple[dict[str, Any], dict[str, Any]]:
    objs = helm.objects("--set", "metrics.serviceMonitor.enabled=true")
    (monitor,) = find(objs, "ServiceMonitor")
    (service,) = find(objs, "Service")
    return monitor, service


def test_the_job_follows_the_servicemonitor_and_its_service(
    chart: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    monitor, service = chart
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    job = scrape_config(monitor, service, kubeconfig, tmp_path)
    assert job["honor_labels"] is True and job["metrics_path"] == "/metrics"
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["namespaces"]["names"] == ["pdw-system"] and sd["api_server"].endswith(":6443")
    assert (tmp_path / "token").read_text() == "t0ken"
    keeps = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"]
             if r.get("action") == "keep"}  # fmt: skip
    for label in service["spec"]["selector"]:
        name = label.replace(".", "_").replace("/", "_").replace("-", "_")
        assert f"__meta_kubernetes_pod_label_{name}" in keeps
    assert keeps["__meta_kubernetes_pod_container_port_name"] == "metrics"


@pytest.mark.parametrize(
    ("break_it", "said"),
    [
        (lambda m: m["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "x"}),
         "selects labels the Service lacks"),
        (lambda m: m["spec"]["namespaceSelector"].update({"matchNames": ["elsewhere"]}),
         "looks in ['elsewhere']"),
        (lambda m: m["spec"]["endpoints"][0].update({"port": "http"}), "no Service port named"),
    ],
    ids=["selector", "namespace", "port"],
)  # fmt: skip
def test_a_servicemonitor_that_selects_nothing_is_refused(
    chart: tuple[dict[str, Any], dict[str, Any]], break_it: Any, said: str
) -> None:
    monitor, service = chart
    check_selects(monitor, service)
    broken = copy.deepcopy(monitor)
    break_it(broken)
    with pytest.raises(AssertionError, match=re.escape(said)):
        check_selects(broken, service)


def test_the_worker_job_follows_the_pod_monitor(helm: Helm, tmp_path: Path) -> None:
    objs = helm.objects("--set", "metrics.podMonitor.enabled=true,watchNamespaces={team-a}")
    (monitor,) = find(objs, "PodMonitor")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    job = pod_monitor_config(monitor, kubeconfig, tmp_path)
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["namespaces"] == {"names": ["team-a"]}
    keeps = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"]
             if r.get("action") == "keep"}  # fmt: skip
    assert keeps["__meta_kubernetes_pod_label_pdwarden_dev_role"] == "prefill|decode"
    assert keeps["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"] == "pdwarden"
    assert keeps["__meta_kubernetes_pod_container_port_name"] == "http"
    copied = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    assert {"pdwarden_dev_deployment", "pdwarden_dev_role", "namespace", "pod"} <= copied
    wide = find(helm.objects("--set", "metrics.podMonitor.enabled=true"), "PodMonitor")[0]
    assert "namespaces" not in pod_monitor_config(wide, kubeconfig, tmp_path)[
        "kubernetes_sd_configs"][0]  # fmt: skip
