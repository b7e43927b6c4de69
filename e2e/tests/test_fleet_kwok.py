"""The operator over a small fleet on kwok (issue 27): behaviour, not timing.

Twenty PDDeployments on kwok nodes whose pod IPs are loopback addresses, every worker pod's
/metrics served there by `bench._fleet_sim`, and `pdwarden run` with the chart's flags under the
chart's own ServiceAccount, RBAC and admission policy (namespaced mode). The API server itself
counts what that identity sends (`e2e.apicount`: APF FlowSchemas per verb and resource). Checked:
every deployment becomes Ready; in steady state, with every pod scraped every interval, over
six remediation cycles of every deployment (the window is their cycle counters advancing, so
each keeps its interval), the operator sends no GET and no LIST but those of a reopened watch
(a watch serves them; before the watch cache it listed StatefulSets and Pods every cycle and
every resync), no status write, and at most MAX_PER_DEPLOYMENT_MINUTE requests per deployment
per minute; one wedged room among the 80 worker pods is failed by the operator and recorded in
that deployment's ledger.

The timing figures are `make bench-fleet`'s (bench/fleet.py), never asserted here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bench._fleet_env import MetricsSim, Operator, wait_until
from bench._fleet_objects import pd_ready
from e2e.apicount import Kubectl, OperatorIdentity, by_verb
from e2e.fixtures import Cluster, create_namespace, release_pddeployments
from e2e.kubelet.kwok import SCALE_POD_PLACEMENT, KwokNodes, loopback_cidrs
from e2e.pdtools import recorded
from e2e.policy_pool import POLICY_CRD

from pdwarden.constants import API_VERSION, KIND, LABEL_DEPLOYMENT, LABEL_ROLE
from pdwarden.sharding import Shard

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
DEPLOYMENTS = 20
PREFILL, DECODE = 2, 2
INTERVAL, WEDGE_AFTER = 5, 6
CYCLES = 6  # the steady window: this many remediation cycles of every deployment (~30 s)
MAX_PER_DEPLOYMENT_MINUTE = 1.0  # API requests; before the watch cache: ~80 (lists per cycle)
# kopf's scan of Namespaces/CRDs, refused under the chart's namespaced RBAC (pdwarden turns it
# off when its namespaces are exact names): none of these in the operator's log.
REFUSED_SCAN = "Not enough permissions"


def manifest(i: int, namespace: str) -> dict[str, object]:
    place = dict(SCALE_POD_PLACEMENT)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": f"pd-{i:02d}", "namespace": namespace},
        "spec": {
            "engine": "pdworker", "image": "pdwarden/pdworker:fleet", "model": {"name": "tiny"},
            "prefill": {"replicas": PREFILL, "gpus": 1, **place},
            "decode": {"replicas": DECODE, "gpus": 1, **place},
            "router": {"replicas": 1, **place},
            "remediation": {"scrapeIntervalSeconds": INTERVAL, "wedgeAfterSeconds": WEDGE_AFTER},
        },
    }  # fmt: skip


def cycles_done(
    operator: Operator,
    since: dict[str, float] | None = None,
    more: int = 0,
    what: str = "",
    count: int = DEPLOYMENTS,
) -> dict[str, float]:
    """Remediation cycles finished per deployment (the operator's counter); with `since`,
    first wait until each of `count` deployments has finished `more` cycles beyond it."""

    def now() -> dict[str, float]:
        out = {}
        for key, value in operator.metrics().items():
            if key.startswith("pdwarden_remediation_cycles_total{") and 'name="' in key:
                out[key.split('name="', 1)[1].split('"', 1)[0]] = value
        return out

    if since is None:
        return now()

    def advanced() -> dict[str, float] | None:
        got = now()
        ok = len(got) >= count and all(got[k] >= since.get(k, 0) + more for k in got)
        return got if ok else None

    return wait_until(what, advanced, (more + 4) * INTERVAL, 0.5)


@dataclass
class World:
    """A namespace for PDDeployments on kwok nodes, the chart's identity for the operators that
    watch it, and every worker pod's /metrics served there by the simulator."""

    kubectl: Kubectl
    ns: str
    identity: OperatorIdentity
    op_kubeconfig: str
    sim: MetricsSim
    directory: Path
    operators: list[Operator] = field(default_factory=list)

    def apply(self, count: int) -> None:
        docs = [manifest(i, self.ns) for i in range(count)]
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": docs}))  # fmt: skip

    def wait_ready(self, count: int) -> None:
        def ready() -> list[str] | None:
            items = json.loads(self.kubectl("get", "pdd", "-n", self.ns, "-o", "json"))["items"]
            done = [o["metadata"]["name"] for o in items if pd_ready(o)]
            return done if len(done) == count else None

        wait_until("every PDDeployment Ready", ready, 300, 2)

    def operator(self, name: str, *extra: str) -> Operator:
        """`pdwarden run` as the chart runs it, stopped with the world."""
        op = Operator(self.op_kubeconfig, self.directory, [f"--namespace={self.ns}", *extra])
        self.operators.append(op)
        return op.start(name)


@contextmanager
def world(cluster: Cluster, tmp_path: Path) -> Iterator[World]:
    if cluster.local is None or cluster.local.pod_cidr_octet is None:
        pytest.skip("needs the local cluster: kwok pod IPs must be loopback addresses here")
    kubectl = Kubectl(cluster.kubectl_path, cluster.kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POLICY_CRD))
    ns = create_namespace(cluster, "fleet")
    suffix = uuid.uuid4().hex[:6]
    kwok = KwokNodes(cluster.kubeconfig, 2, gpus=64, pods=64, prefix=f"fleet-{suffix}-",
                     log_path=tmp_path / "kwok.log",
                     pod_cidr=loopback_cidrs(cluster.local.pod_cidr_octet))  # fmt: skip
    identity = OperatorIdentity(kubectl, cluster.helm_path, tmp_path, namespace=f"{ns}-op",
                                watch_namespaces=(ns,))  # fmt: skip
    w = None
    try:
        kwok.start(ready_timeout=120)
        op_kubeconfig = identity.create(cluster.kubeconfig)
        sim = MetricsSim.start(cluster.kubeconfig, [ns], tmp_path / "sim.log")
        w = World(kubectl, ns, identity, op_kubeconfig, sim, tmp_path)
        yield w
    finally:
        if w is not None:
            for op in w.operators:
                op.stop()
            w.sim.stop()
        identity.close()
        cluster.kubectl("delete", "namespace", ns, f"{ns}-op", "--wait=false", check=False)
        release_pddeployments(cluster, ns)
        kwok.stop()


def test_a_fleet_on_kwok_is_ready_quiet_and_repaired(
    cluster: Cluster, crd: str, tmp_path: Path
) -> None:
    with world(cluster, tmp_path) as w:
        kubectl, ns, sim, identity = w.kubectl, w.ns, w.sim, w.identity
        operator = w.operator("operator")
        w.apply(DEPLOYMENTS)
        w.wait_ready(DEPLOYMENTS)

        # Steady state: every worker pod scraped, then CYCLES more remediation cycles of every
        # deployment (about CYCLES intervals), counted by the API server.
        workers = DEPLOYMENTS * (PREFILL + DECODE)

        def scraped() -> bool:
            since = time.time() - 2 * INTERVAL
            got = sim.call("GET", f"/scrapes?since={since}")["scrapes"]
            return sum(1 for ts in got.values() if ts) >= workers

        wait_until("every worker pod scraped", scraped, 120, 1)
        cycles_done(operator, cycles_done(operator), 2, "two more cycles of every deployment")
        before, start = identity.counts(), cycles_done(operator)
        t0 = time.monotonic()
        cycles_done(operator, start, CYCLES, f"{CYCLES} more cycles of every deployment")
        minutes = (time.monotonic() - t0) / 60
        after = identity.counts()
        # kopf re-LISTs each of its resources whenever it reopens that resource's watch (every
        # 300 s): a LIST is a poll unless a WATCH of the same resource follows it, counted up to
        # one cycle past the window (the window may end between the two).
        cycles_done(operator, cycles_done(operator), 1, "one more cycle of every deployment")
        later = identity.counts()
        verbs = by_verb(before, after)
        detail = {k: after[k] - before[k] for k in after if after[k] - before[k]}
        said = f"steady state, {minutes * 60:.0f} s: {detail}"
        polls = {k: n for k, n in detail.items() if k.startswith("list ")
                 and n > later["watch " + k[5:]] - before["watch " + k[5:]]}  # fmt: skip
        # A watch serves every read: no GET and no LIST but a watch's own, while nothing changes.
        assert verbs["get"] == 0 and not polls, said
        # Conditions keep their place and nothing changed: no status write per pass or cycle.
        status_writes = sum(v for k, v in detail.items() if k.endswith("pddeployments/status"))
        assert status_writes == 0, said
        # Whatever else (events, a watch reopened): bounded per deployment, not per pass or pod.
        assert sum(verbs.values()) <= MAX_PER_DEPLOYMENT_MINUTE * DEPLOYMENTS * minutes, said

        # One wedged room among all pods: failed by the operator, recorded in the ledger.
        pods = json.loads(kubectl("get", "pods", "-n", ns, "-l",
                                  f"{LABEL_DEPLOYMENT}=pd-07,{LABEL_ROLE}=prefill",
                                  "-o", "json"))["items"]  # fmt: skip
        target = pods[0]
        sim.call("POST", "/wedge", {"ip": target["status"]["podIP"], "room": 4242})
        wait_until("the wedged room failed",
                   lambda: (sim.call("GET", "/wedge") or {}).get("repaired"),
                   WEDGE_AFTER + 6 * INTERVAL, 0.5)  # fmt: skip

        def failed_rooms() -> list[dict[str, object]]:
            obj = json.loads(kubectl("get", "pdd", "pd-07", "-n", ns, "-o", "json"))
            history = ((obj.get("status") or {}).get("remediation") or {}).get("history") or []
            return [e for e in recorded(history) if e.get("action") == "FailRooms"
                    and e.get("pod") == target["metadata"]["name"]]  # fmt: skip

        entries = wait_until("FailRooms in pd-07's ledger", failed_rooms, 30, 1)
        assert entries[-1].get("outcome") == "Succeeded", entries
        log = operator.proc.log.read_text()  # type: ignore[union-attr]
        assert REFUSED_SCAN not in log, "kopf scanned what the chart's namespaced RBAC refuses"


def test_shards_split_the_fleet_and_each_object_has_one_owner(
    cluster: Cluster, crd: str, tmp_path: Path
) -> None:
    """`pdwarden run --shard I/N` (pdwarden/sharding.py): two replicas, each with half the
    fleet, together reconcile and scrape every deployment, and no deployment twice."""
    shards = [Shard(0, 2), Shard(1, 2)]
    with world(cluster, tmp_path) as w:
        # The namespace's name is random: take deployments until each shard owns at least two.
        count = next(n for n in range(4, DEPLOYMENTS) if all(
            sum(s.owns(w.ns, f"pd-{i:02d}") for i in range(n)) >= 2 for s in shards))  # fmt: skip
        names = {f"pd-{i:02d}" for i in range(count)}
        owned = [{n for n in names if s.owns(w.ns, n)} for s in shards]
        ops = [w.operator(f"shard-{s.index}", f"--shard={s}") for s in shards]
        w.apply(count)
        w.wait_ready(count)
        # Each replica counts cycles for what it runs: one of each of its own, and nothing else.
        for op, mine in zip(ops, owned, strict=True):
            got = cycles_done(op, {}, 1, f"a cycle of each of {sorted(mine)}", count=len(mine))
            assert set(got) == mine, (got, mine)  # its own, and nothing of the other shard's
            managed = op.metrics().get("pdwarden_managed_deployments")
            assert managed == len(mine), (managed, mine)
