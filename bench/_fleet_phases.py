"""What the fleet bench does at each size, and at the largest size to the whole fleet.

Per size: create, steady, the no-watch-cache baseline, rollout (bench/fleet.py's docstring says
what each measures). At the largest: one wedged room, one hostile pod, a profile of the operator.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from e2e.apicount import by_verb, rates

from bench import _fleet_report as report
from bench._fleet_env import Operator, histogram, quantile, total, wait_until
from bench._fleet_objects import (
    INTERVAL,
    PODS_PER_DEPLOYMENT,
    WEDGE_AFTER,
    apply,
    items,
    lws,
    pd_namespace,
    pd_ready,
    pddeployment,
    ready_seconds,
)
from bench._fleet_rig import LWS_NS, PD_NS, FleetRig, log
from pdwarden.constants import LABEL_ROLE

# A size whose worst deployment waits more than this many intervals between scrapes saturates
# one replica: its rollout is skipped (it would measure the backlog, ~20 min at 200).
SATURATED_PERIODS = 2


class Fleet(FleetRig):
    """The phases of one run, on its rig; bench.fleet.run calls them size after size."""

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

    def settle(self) -> float:
        """Wait (up to 300 s) until the operator applies almost nothing (at most one object per
        10 deployments per 2 intervals): a window opened while the last phase's backlog still
        drains measures the backlog (seen at 200: token Secrets re-created at 11/s, 254 status
        conflicts in 60 s)."""
        op, t0 = self.operator, time.monotonic()
        bound = max(self.n, 10) / 10

        def applied() -> float:
            before = total(op.metrics(), "pdwarden_objects_applied_total")
            time.sleep(2 * INTERVAL)
            return total(op.metrics(), "pdwarden_objects_applied_total") - before

        while (got := applied()) > bound and time.monotonic() - t0 < 300:
            log(f"settling: {got:.0f} objects applied in {2 * INTERVAL} s (bound {bound:.0f})")
        return round(time.monotonic() - t0, 1)

    def steady(self, name: str) -> dict[str, Any]:
        op = self.operator
        assert op.proc is not None
        settled = self.settle()  # the last phase's passes finish first
        t0, wall0 = time.monotonic(), time.time()
        prom0 = self.prometheus_cpu()
        cpu0, lws0, c0, m0 = op.proc.cpu(), self.lws_cpu(), self.identity.counts(), op.metrics()
        time.sleep(self.window)
        secs = time.monotonic() - t0
        c1, m1 = self.identity.counts(), op.metrics()
        scrapes = self.sim.call("GET", f"/scrapes?since={wall0}")["scrapes"]
        verbs = by_verb(c0, c1)
        out = {
            "settled_after_s": settled,
            "window_seconds": round(secs, 1),
            "operator_cores": round((op.proc.cpu() - cpu0) / secs, 3),
            "operator_rss_mb": round(op.proc.rss(), 1),
            "operator_peak_rss_mb": round(op.proc.peak_rss(), 1),  # so far, bursts included
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
        if self.prometheus is not None:  # prometheus mode: the screen, and Prometheus itself
            queries = (total(m1, "pdwarden_screen_queries_total")
                       - total(m0, "pdwarden_screen_queries_total"))  # fmt: skip
            out |= {
                "prometheus_cores": round((self.prometheus_cpu() - prom0) / secs, 3),
                "prometheus_rss_mb": round(self.prometheus_rss(), 1),
                "screen_period_s": round(secs / queries, 2) if queries else None,
                "screen_seconds_p99": quantile(histogram(m0, "pdwarden_screen_seconds"),
                                               histogram(m1, "pdwarden_screen_seconds"), 0.99),
                "pods_screened_per_s": round((total(m1, "pdwarden_screened_pods_total")
                                              - total(m0, "pdwarden_screened_pods_total")) / secs,
                                             1),
                "direct_reads_per_s": round((total(m1, "pdwarden_scrapes_total")
                                             - total(m0, "pdwarden_scrapes_total")) / secs, 2),
            }  # fmt: skip
        log(f"{name}: {json.dumps({k: v for k, v in out.items() if 'by_' not in k})}")
        return out

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
            if p["metadata"]["labels"].get(LABEL_ROLE) == "prefill"
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

    def screened(self) -> dict[str, Any]:
        """The same fleet in prometheus mode: a real Prometheus discovers and scrapes every
        worker pod as the chart's PodMonitor says (every INTERVAL), the operator restarts with
        `--observe prometheus`, then the steady window and the wedge again, side by side with
        the direct mode's above (same fleet, same machine, one run)."""
        log("prometheus mode: starting Prometheus over every worker pod")
        self.start_prometheus()
        assert self.prometheus is not None
        workers = self.n * (PODS_PER_DEPLOYMENT - 1)
        wait_until(
            "Prometheus scraping every worker pod",
            lambda: len(self.prometheus.query("up == 1")) >= workers,  # type: ignore[union-attr]
            600, 5.0,
        )  # fmt: skip
        self.operator.stop()
        self.operator = Operator(
            self.operator.kubeconfig, self.dir,
            ["--observe=prometheus", f"--prometheus-url={self.prometheus.url}"],
        ).start("operator-prometheus")  # fmt: skip
        out: dict[str, Any] = {"steady": self.steady("prometheus")}
        out["wedge"] = self.wedge()
        return out

    def profile(self) -> dict[str, Any]:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            return {"skipped": "py-spy is not installed (pip install py-spy)"}
        assert self.operator.proc is not None
        return report.py_spy(spy, self.operator.proc.pid, self.dir / "profile.txt", 20)
