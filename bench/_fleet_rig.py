"""One fleet bench run's rig: the world it set up and the meters read around each phase.

bench._fleet_env's pieces (control plane, kwok nodes, metrics simulator, operator, LWS) wired
together, and what each phase reads before and after: operator and LWS CPU, API requests by verb
and resource, reconcile latency, status conflicts. Why apart from the phases
(bench/_fleet_phases.py): the set-up and the metering stay the same whichever phase runs.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from e2e.apicount import Kubectl, OperatorIdentity, by_verb, rates
from e2e.cluster.controlplane import LocalCluster, build_binaries, free_port
from e2e.fixtures import Cluster
from e2e.kubelet.kwok import KwokNodes, loopback_cidrs
from e2e.lws import LwsController
from e2e.prometheus import PrometheusServer, pod_monitor_config, pod_monitor_of_chart

from bench import common
from bench._fleet_env import (
    MetricsSim,
    Operator,
    cpu_seconds,
    histogram,
    quantile,
    rss_mb,
    stopping,
    total,
    wait_until,
)
from bench._fleet_objects import (
    INTERVAL,
    PODS_PER_DEPLOYMENT,
    apply,
    items,
    lws_ready,
    pd_namespace,
)
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE

PD_NS, LWS_NS = "fleet", "lws"
PODS_PER_NODE = 240


def log(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class FleetRig:
    """A fleet bench run's world and meters: `setup` starts it, `teardown` stops all of it."""

    def __init__(
        self, quick: bool, directory: Path, baseline: bool, sizes: tuple[int, ...] = (),
        *, with_lws: bool = True, lws_rollout: bool = False,
    ) -> None:  # fmt: skip
        self.quick, self.dir, self.baseline, self.with_lws = quick, directory, baseline, with_lws
        self.lws_rollout = lws_rollout
        self.sizes = sizes or ((10,) if quick else (10, 50, 200))
        self.lws_pid = 0
        self.window = 30.0 if quick else 60.0
        self.results: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.rev = 0
        self.n = 0
        self.prometheus: PrometheusServer | None = None

    # -- the world -------------------------------------------------------------------------

    def setup(self) -> None:
        self.local = LocalCluster(self.dir / "cluster", with_kubelet=False)
        self.local.start()
        bin_dir = build_binaries()
        admin = str(self.local.kubeconfig)
        self.kubectl = Kubectl(str(bin_dir / "kubectl"), admin)
        for crd in sorted(Path(common.BENCH_DIR.parent / "crds").glob("*.yaml")):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        nodes = math.ceil(2 * max(self.sizes) * PODS_PER_DEPLOYMENT / PODS_PER_NODE) + 1
        assert self.local.pod_cidr_octet is not None
        self.kwok = KwokNodes(admin, nodes, gpus=PODS_PER_NODE, pods=PODS_PER_NODE,
                              prefix="fleet-", log_path=self.dir / "kwok.log",
                              pod_cidr=loopback_cidrs(self.local.pod_cidr_octet))  # fmt: skip
        log(f"{nodes} kwok nodes Ready in {self.kwok.start(ready_timeout=300):.0f} s")
        self.pd_ns = [pd_namespace(i, PD_NS) for i in range(4)]
        self.lws_ns = [pd_namespace(i, LWS_NS) for i in range(4)]
        for ns in (*self.pd_ns, *self.lws_ns):
            self.kubectl("create", "namespace", ns)
        self.identity = OperatorIdentity(self.kubectl, str(bin_dir / "helm"), self.dir,
                                         namespace="pdwarden-system")  # fmt: skip
        op_kubeconfig = self.identity.create(admin)
        self.sim = MetricsSim.start(admin, self.pd_ns, self.dir / "sim.log")
        self.operator = Operator(op_kubeconfig, self.dir).start()
        time.sleep(5)  # kopf's discovery and first watches, before the first objects arrive
        cluster = Cluster(kubeconfig=admin, bin_dir=bin_dir, local=self.local)
        self.lws = LwsController(cluster, self.dir / "lws")
        if self.with_lws:
            self.lws.start()
            assert self.lws.proc is not None
            self.lws_pid = self.lws.proc.pid

    def start_prometheus(self) -> None:
        """A real Prometheus scraping every worker pod the chart's PodMonitor selects, every
        INTERVAL, discovering them through the API server."""
        work = self.dir / "prometheus"
        work.mkdir(exist_ok=True)
        bin_dir = build_binaries()
        job = pod_monitor_config(pod_monitor_of_chart(str(bin_dir / "helm")),
                                 Path(self.local.kubeconfig), work)  # fmt: skip
        # Prometheus reads whole units only ("2.5s" is refused): milliseconds.
        job |= {"scrape_interval": f"{int(INTERVAL * 1000)}ms",
                "scrape_timeout": f"{int(INTERVAL * 500)}ms"}  # fmt: skip
        self.prometheus = PrometheusServer(work, free_port())
        self.prometheus.start([job], {"groups": []})

    def prometheus_cpu(self) -> float:
        proc = self.prometheus.proc if self.prometheus else None
        return cpu_seconds(proc.pid) if proc else 0.0

    def prometheus_rss(self) -> float:
        proc = self.prometheus.proc if self.prometheus else None
        return rss_mb(proc.pid) if proc else 0.0

    def teardown(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        parts = [getattr(self, k, None) for k in ("local", "kwok", "lws", "sim", "operator")]
        with stopping(*[p for p in parts if p is not None]):
            if hasattr(self, "identity"):
                self.identity.close()

    # -- measuring helpers -----------------------------------------------------------------

    def lws_cpu(self) -> float:
        return cpu_seconds(self.lws_pid) if self.lws_pid else 0.0

    def lws_rss(self) -> float:
        return rss_mb(self.lws_pid) if self.lws_pid else 0.0

    def lws_phase(self, name: str, objs: list[dict[str, Any]], n: int, timeout: float
                  ) -> dict[str, Any]:  # fmt: skip
        if not self.with_lws:
            return {"skipped": "--skip-lws", "lws_cpu_seconds": 0.0, "ready_seconds": {}}
        return self.phase(name, lambda: apply(self.kubectl, objs),
                          self.all_ready(lws_ready, "lws", self.lws_ns, n), timeout)  # fmt: skip

    def deployments(self) -> list[dict[str, Any]]:
        return [o for o in items(self.kubectl, "pdd", self.pd_ns)]

    def phase(self, name: str, act: Any, done: Any, timeout: float) -> dict[str, Any]:
        """Run `act()`, wait for `done()`, and measure the operator and the API server."""
        op, t0 = self.operator, time.monotonic()
        cpu0, lws0, c0, m0 = op.proc.cpu(), self.lws_cpu(), self.identity.counts(), op.metrics()  # type: ignore[union-attr]
        act()
        wait_until(name, done, timeout, every=2.0)
        secs = time.monotonic() - t0
        c1, m1 = self.identity.counts(), op.metrics()
        return {
            "seconds": round(secs, 1),
            "operator_cpu_seconds": round(op.proc.cpu() - cpu0, 2),  # type: ignore[union-attr]
            "lws_cpu_seconds": round(self.lws_cpu() - lws0, 2),
            "requests_per_s_by_verb": {k: round(v / secs, 2) for k, v in by_verb(c0, c1).items()},
            "requests_per_s": rates(c0, c1, secs),
            "reconcile_p50_s": quantile(histogram(m0, "pdwarden_reconcile_seconds"),
                                        histogram(m1, "pdwarden_reconcile_seconds"), 0.5),
            "reconcile_p99_s": quantile(histogram(m0, "pdwarden_reconcile_seconds"),
                                        histogram(m1, "pdwarden_reconcile_seconds"), 0.99),
            "status_conflicts": total(m1, "pdwarden_status_conflicts_total")
            - total(m0, "pdwarden_status_conflicts_total"),
        }  # fmt: skip

    def all_ready(self, ready: Any, resource: str, namespaces: list[str], n: int) -> Any:
        def check() -> list[dict[str, Any]] | None:
            objs = items(self.kubectl, resource, namespaces)
            return objs if len(objs) >= n and all(ready(o) for o in objs) else None

        return check

    def scraped_all(self, pods: int) -> bool:
        status = self.sim.call("GET", "/status")
        if status["bound"] < pods:
            return False
        since = time.time() - 2 * INTERVAL
        got = self.sim.call("GET", f"/scrapes?since={since}")["scrapes"]
        return sum(1 for ts in got.values() if ts) >= pods

    # -- the phases --------------------------------------------------------------------------
    def ip_owners(self) -> dict[str, str]:
        pods = items(self.kubectl, "pods", self.pd_ns)
        return {
            p["status"]["podIP"]: p["metadata"]["labels"].get(LABEL_DEPLOYMENT, "")
            for p in pods if (p.get("status") or {}).get("podIP")
            and p["metadata"]["labels"].get(LABEL_ROLE) in ("prefill", "decode")
            and not p["metadata"].get("deletionTimestamp")
        }  # fmt: skip
