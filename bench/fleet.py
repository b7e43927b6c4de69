"""The operator at fleet scale on a real API server, side by side with LeaderWorkerSet (issue 27).

What runs: the local control plane (etcd, kube-apiserver, controller-manager, scheduler) with
kwok GPU nodes whose podCIDRs lie inside 127.0.0.0/8, so every pod IP is a loopback address;
`bench._fleet_sim` serves each worker pod's /metrics on its pod IP; `pdwarden run` with the
chart's flags under the chart's ServiceAccount, RBAC and admission policy; LWS's own controller.
Sizes (cumulative): 10, 50, 200 PDDeployments of 25 pods (quick: 10), and as many
LeaderWorkerSets of 5 x 5 pods beside them.

Per size, in this order:
* create: PDDeployments with remediation Off, then as many LWS: apply -> Ready per object
  (condition lastTransitionTime - creationTimestamp), controller CPU seconds (reconcile side);
* steady: remediation Enforce, scraping every pod every 5 s; over a window: operator CPU and
  RSS, API requests by verb and resource from the API server's own counters (APF FlowSchemas
  matching the operator's ServiceAccount, `e2e.apicount`), Events/min (= Event creates), status
  conflicts, reconcile-pass latency (the operator's histogram), each pod's scrape period as the
  simulator saw it, LWS's CPU and RSS;
* baseline (at the smallest size only): the same window with `--no-watch-cache` (every pass
  and cycle lists from the API server and the resync daemon passes every 5 s, as before);
* rollout: every PDDeployment's pod template changed at once, until all are Ready again
  (skipped at a saturated size: not every pod scraped within two intervals after 300 s, or the
  worst deployment's scrape period p99 above two intervals):
  requests/s by verb and CPU; with --lws-rollout, then the same for every LWS (off by default:
  the LWS controller replaces one group of each LWS at a time, 9 of the first quick run's 20
  minutes, and the reconcile-side ratio is taken at create).
At the largest size: one wedged prefill room among all pods (detect + repair time against
wedgeAfterSeconds + 2 intervals), one hostile pod (1.5 s late, then ~1 MiB /metrics) and every
other deployment's scrape period against the steady window, and a py-spy profile of the
operator (if py-spy is installed).

`make bench-fleet` (QUICK=1: quick). Full mode takes 40-80 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e.apicount import Kubectl, OperatorIdentity, by_verb, rates
from e2e.cluster.controlplane import LocalCluster, build_binaries
from e2e.fixtures import Cluster
from e2e.kubelet.kwok import KwokNodes, loopback_cidrs
from e2e.lws import LwsController

from bench import _fleet_report as report
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
    WEDGE_AFTER,
    apply,
    items,
    lws,
    lws_ready,
    pd_namespace,
    pd_ready,
    pddeployment,
    ready_seconds,
)

PD_NS, LWS_NS = "fleet", "lws"
PODS_PER_NODE = 240
# A size whose worst deployment waits more than this many intervals between scrapes saturates
# one replica: its rollout is skipped (it would measure the backlog, ~20 min at 200).
SATURATED_PERIODS = 2


def log(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Fleet:
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

    def teardown(self) -> None:
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

    def grow(self, n: int) -> dict[str, Any]:
        new = range(self.n, n)
        row: dict[str, Any] = {"deployments": n, "pods": n * PODS_PER_DEPLOYMENT}
        created = time.time()
        row["create"] = self.phase(
            "PDDeployments Ready",
            lambda: apply(self.kubectl, [pddeployment(i, pd_namespace(i, PD_NS), "Off", self.rev)
                                         for i in new]),
            self.all_ready(pd_ready, "pdd", self.pd_ns, n), 300 + 3 * len(new),
        )  # fmt: skip
        times = [ready_seconds(o, "Ready") for o in self.deployments()
                 if o["metadata"]["name"] >= f"pd-{self.n:03d}"]  # fmt: skip
        row["create"]["ready_seconds"] = report.spread([t for t in times if t is not None])
        row["lws_create"] = self.lws_phase(
            "LeaderWorkerSets Ready", [lws(i, pd_namespace(i, LWS_NS), self.rev) for i in new],
            n, 300 + 3 * len(new),
        )  # fmt: skip
        if self.with_lws:
            lws_times = [ready_seconds(o, "Available") for o in items(self.kubectl, "lws",
                         self.lws_ns) if o["metadata"]["name"] >= f"lws-{self.n:03d}"]  # fmt: skip
            row["lws_create"]["ready_seconds"] = report.spread([t for t in lws_times if t])
        log(f"{n}: created in {time.time() - created:.0f} s; enabling remediation")
        apply(self.kubectl, [pddeployment(i, pd_namespace(i, PD_NS), "Enforce", self.rev)
                             for i in new])  # fmt: skip
        self.n = n
        workers = n * (PODS_PER_DEPLOYMENT - 1)
        try:
            wait_until("every worker pod scraped", lambda: self.scraped_all(workers), 300, 2.0)
        except TimeoutError as e:
            # The operator cannot keep every pod inside two intervals: this size saturates the
            # replica. Measure the steady window anyway (its scrape periods say by how much).
            row["saturated"] = str(e)
            log(f"{n}: saturated: {e}")
        row["steady"] = self.steady("steady")
        behind = row["steady"].get("worst_deployment_period_p99_s") or 0.0
        if "saturated" not in row and behind > SATURATED_PERIODS * INTERVAL:
            # Every pod was reached once, but some deployment waits for its next scrape more
            # than twice the interval: the replica has fallen behind its own interval.
            row["saturated"] = (f"worst deployment's scrape period p99 {behind} s > "
                                f"{SATURATED_PERIODS} x the {INTERVAL} s interval")  # fmt: skip
            log(f"{n}: saturated: {row['saturated']}")
        if self.baseline and n == min(self.sizes):
            row["baseline_no_watch_cache"] = self.without_cache()
        if "saturated" not in row:  # a saturated replica's rollout measures only its backlog
            row["rollout"] = self.rollout(n)
        return row

    def steady(self, name: str) -> dict[str, Any]:
        op = self.operator
        assert op.proc is not None
        time.sleep(2 * INTERVAL)  # let the last phase's passes finish
        t0, wall0 = time.monotonic(), time.time()
        cpu0, lws0, c0, m0 = op.proc.cpu(), self.lws_cpu(), self.identity.counts(), op.metrics()
        time.sleep(self.window)
        secs = time.monotonic() - t0
        c1, m1 = self.identity.counts(), op.metrics()
        scrapes = self.sim.call("GET", f"/scrapes?since={wall0}")["scrapes"]
        verbs = by_verb(c0, c1)
        out = {
            "window_seconds": round(secs, 1),
            "operator_cores": round((op.proc.cpu() - cpu0) / secs, 3),
            "operator_rss_mb": round(op.proc.rss(), 1),
            "lws_cores": round((self.lws_cpu() - lws0) / secs, 4),
            "lws_rss_mb": round(self.lws_rss(), 1),
            "requests_per_s": round(sum(verbs.values()) / secs, 3),
            "requests_per_s_by_verb": {k: round(v / secs, 3) for k, v in verbs.items()},
            "requests_per_s_by_resource": rates(c0, c1, secs),
            "events_per_min": round((c1["create events"] - c0["create events"]) * 60 / secs, 2),
            "status_conflicts": total(m1, "pdwarden_status_conflicts_total")
            - total(m0, "pdwarden_status_conflicts_total"),
            "reconcile_passes": total(m1, "pdwarden_reconcile_passes_total")
            - total(m0, "pdwarden_reconcile_passes_total"),
            "cycle_wall_p50_s": quantile(histogram(m0, "pdwarden_scrape_cycle_seconds"),
                                         histogram(m1, "pdwarden_scrape_cycle_seconds"), 0.5),
            "cycle_wall_p99_s": quantile(histogram(m0, "pdwarden_scrape_cycle_seconds"),
                                         histogram(m1, "pdwarden_scrape_cycle_seconds"), 0.99),
            **report.periods(scrapes, self.ip_owners()),
        }  # fmt: skip
        log(f"{name}: {json.dumps({k: v for k, v in out.items() if 'by_' not in k})}")
        return out

    def ip_owners(self) -> dict[str, str]:
        pods = items(self.kubectl, "pods", self.pd_ns)
        return {
            p["status"]["podIP"]: p["metadata"]["labels"].get("pdwarden.dev/deployment", "")
            for p in pods if (p.get("status") or {}).get("podIP")
            and p["metadata"]["labels"].get("pdwarden.dev/role") in ("prefill", "decode")
            and not p["metadata"].get("deletionTimestamp")
        }  # fmt: skip

    def without_cache(self) -> dict[str, Any]:
        log("baseline: the operator with --no-watch-cache")
        self.operator.stop()
        self.operator = Operator(self.operator.kubeconfig, self.dir, ["--no-watch-cache"])
        self.operator.start("operator-no-cache")
        time.sleep(3 * INTERVAL)
        out = self.steady("baseline")
        self.operator.stop()
        self.operator = Operator(self.operator.kubeconfig, self.dir).start()
        time.sleep(3 * INTERVAL)
        return out

    def rollout(self, n: int) -> dict[str, Any]:
        self.rev += 1
        rev = self.rev
        out = self.phase(
            "PDDeployments rolled out",
            lambda: apply(self.kubectl, [pddeployment(i, pd_namespace(i, PD_NS), "Enforce", rev)
                                         for i in range(n)]),
            self.all_ready(pd_ready, "pdd", self.pd_ns, n), 600 + 6 * n,
        )  # fmt: skip
        if self.lws_rollout:
            out["lws"] = self.lws_phase(
                "LeaderWorkerSets rolled out",
                [lws(i, pd_namespace(i, LWS_NS), rev) for i in range(n)], n, 600 + 6 * n,
            )  # fmt: skip
        return out

    def wedge(self) -> dict[str, Any]:
        pods = items(self.kubectl, "pods", [pd_namespace(self.n - 1, PD_NS)])
        target = next(
            p
            for p in pods
            if p["metadata"]["labels"].get("pdwarden.dev/role") == "prefill"
            and p["metadata"]["name"].startswith(f"pd-{self.n - 1:03d}")
        )
        ip = target["status"]["podIP"]
        self.sim.call("POST", "/wedge", {"ip": ip, "room": 4242})
        bound = WEDGE_AFTER + 2 * INTERVAL
        out: dict[str, Any] = {"pod": target["metadata"]["name"], "bound_seconds": bound}
        try:
            got = wait_until("the wedged room failed by the operator",
                             lambda: (self.sim.call("GET", "/wedge") or {}).get("repaired"),
                             3 * bound + 60, 0.5)  # fmt: skip
        except TimeoutError as e:  # a saturated replica may miss it: recorded, not fatal
            out.update(seconds=None, missed=str(e))
            return out
        w = self.sim.call("GET", "/wedge")
        return {**out, "seconds": round(got - w["injected"], 1), "fail_calls": w["fail_calls"]}

    def hostile(self, baseline: dict[str, Any]) -> dict[str, Any]:
        owners = self.ip_owners()
        victim = next(ip for ip, d in owners.items() if d == f"pd-{self.n - 2:03d}")
        out: dict[str, Any] = {"pod_ip": victim, "deployment": owners[victim]}
        for mode, seconds in (("slow", 1.5), ("huge", 0.0)):
            self.sim.call("POST", "/hostile", {"ip": victim, "mode": mode, "seconds": seconds})
            time.sleep(2 * INTERVAL)
            wall0 = time.time()
            time.sleep(self.window / 2)
            scrapes = self.sim.call("GET", f"/scrapes?since={wall0}")["scrapes"]
            out[mode] = report.periods(scrapes, owners, exclude=owners[victim])
            out[mode]["own_deployment"] = report.periods(
                {ip: ts for ip, ts in scrapes.items() if owners.get(ip) == owners[victim]}, owners
            )
        self.sim.call("POST", "/hostile", {"ip": victim, "mode": "off"})
        out["steady_period_p50_s"] = baseline.get("period_p50_s")
        out["steady_period_p99_s"] = baseline.get("period_p99_s")
        return out

    def profile(self) -> dict[str, Any]:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            return {"skipped": "py-spy is not installed (pip install py-spy)"}
        assert self.operator.proc is not None
        return report.py_spy(spy, self.operator.proc.pid, self.dir / "profile.txt", 20)


def run(
    quick: bool, out: Path, readme: Path | None, *, baseline: bool = True,
    sizes: tuple[int, ...] = (), with_lws: bool = True, lws_rollout: bool = False,
) -> dict[str, Any]:  # fmt: skip
    started = time.monotonic()
    load_before = report.load()
    directory = Path(tempfile.mkdtemp(prefix="pdwarden-fleet-"))
    fleet = Fleet(quick, directory, baseline, sizes, with_lws=with_lws, lws_rollout=lws_rollout)
    log(f"working in {fleet.dir}")
    try:
        fleet.setup()
        for n in fleet.sizes:
            log(f"== {n} deployments")
            fleet.results.append(fleet.grow(n))
            # Sizes done so far, so a later failure (a timeout at a larger size) loses nothing.
            (directory / "partial.json").write_text(json.dumps(fleet.results, indent=1))
            log(f"sizes so far in {directory / 'partial.json'}")
        last = fleet.results[-1]
        fleet.extra["wedge"] = fleet.wedge()
        fleet.extra["hostile"] = fleet.hostile(last["steady"])
        fleet.extra["profile"] = fleet.profile()
    finally:
        fleet.teardown()
    data = {
        "sizes": list(fleet.sizes), "interval_seconds": INTERVAL,
        "pods_per_deployment": PODS_PER_DEPLOYMENT, "results": fleet.results, **fleet.extra,
        "load_average": {"before": load_before, "after": report.load()},
        "wall_seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip
    data["goals"] = report.goals(data)
    common.finish(out, "fleet", quick, readme, data, report.figures(data),
                  lambda p: report.plot(p, data))  # fmt: skip
    return data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="10 deployments only (< 10 min)")
    p.add_argument("--out", type=Path, default=common.DEFAULT_OUT)
    p.add_argument("--readme", type=Path, default=None)
    p.add_argument("--no-baseline", action="store_true", help="skip the --no-watch-cache window")
    p.add_argument("--sizes", default="", help="development: comma-separated sizes instead")
    p.add_argument("--skip-lws", action="store_true", help="development: no LWS side")
    p.add_argument("--lws-rollout", action="store_true",
                   help="also roll every LeaderWorkerSet out (slow: LWS replaces one group of "
                        "each at a time; 9 min for 10 of them in the first quick run)")  # fmt: skip
    a = p.parse_args(argv)
    sizes = tuple(int(x) for x in a.sizes.split(",") if x)
    readme = a.readme or (common.README if a.out.resolve() == common.DEFAULT_OUT.resolve()
                          else None)  # fmt: skip
    data = run(a.quick, a.out, readme, baseline=not a.no_baseline, sizes=sizes,
               with_lws=not a.skip_lws, lws_rollout=a.lws_rollout)  # fmt: skip
    print(json.dumps(data["goals"], indent=1))


if __name__ == "__main__":
    main()
