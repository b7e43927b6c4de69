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
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _fleet_report as report
from bench import common
from bench._fleet_objects import INTERVAL, PODS_PER_DEPLOYMENT
from bench._fleet_phases import Fleet
from bench._fleet_rig import log


def run(
    quick: bool, out: Path, readme: Path | None, *, baseline: bool = True,
    sizes: tuple[int, ...] = (), with_lws: bool = True, lws_rollout: bool = False,
    observe: str = "both",
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
        if observe != "direct":
            fleet.extra["prometheus_mode"] = fleet.screened()
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
    p.add_argument("--observe", choices=("both", "direct"), default="both",
                   help="both (default): at the largest size, the steady window and the wedge "
                        "again in prometheus mode, beside a real Prometheus")  # fmt: skip
    a = p.parse_args(argv)
    sizes = tuple(int(x) for x in a.sizes.split(",") if x)
    readme = a.readme or (common.README if a.out.resolve() == common.DEFAULT_OUT.resolve()
                          else None)  # fmt: skip
    data = run(a.quick, a.out, readme, baseline=not a.no_baseline, sizes=sizes,
               with_lws=not a.skip_lws, lws_rollout=a.lws_rollout, observe=a.observe)  # fmt: skip
    print(json.dumps(data["goals"], indent=1))


if __name__ == "__main__":
    main()
