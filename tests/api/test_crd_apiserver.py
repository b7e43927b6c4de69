"""The CRD against a real kube-apiserver: it installs, examples round-trip, bad specs bounce.

Every refusal here comes from the API server (OpenAPI schema, CEL rules, strict field
validation), never from pdwarden code: nothing of ours runs in these tests except the YAML.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e.fixtures import Cluster

from pdwarden import constants
from pdwarden.api import parse_spec, parse_status, spec_to_wire, status_to_wire
from pdwarden.api.base import prune_empty

from .apiserver import applied, assert_refused, document, install
from .cases import BAD_SPECS, CRD_FILE, Bad, load_examples

pytestmark = pytest.mark.cluster
EXAMPLES = load_examples()


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[tuple[Cluster, str]]:
    """The CRD installed and Established, and a namespace for this module's objects."""
    for ns in install(cluster, CRD_FILE, constants.CRD_NAME, "pdd-api"):
        yield cluster, ns


def _doc(name: str, spec: dict[str, Any]) -> str:
    return document(constants.KIND, name, spec)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_applies_and_round_trips_with_defaults(
    api: tuple[Cluster, str], example: str
) -> None:
    cluster, ns = api
    doc = EXAMPLES[example]
    with applied(cluster, ns, doc) as stored:
        expected = parse_spec(doc["spec"])
        # The API server filled in exactly the defaults the models declare, no more, no less.
        assert stored == prune_empty(spec_to_wire(expected))
        assert parse_spec(stored) == expected
        assert (
            stored["remediation"]["wedgeAfterSeconds"] == expected.remediation.wedge_after_seconds
        )


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_api_server_refuses_bad_spec_naming_the_field(api: tuple[Cluster, str], case: Bad) -> None:
    cluster, ns = api
    assert_refused(cluster, ns, _doc(f"bad-{case.id}", case.spec), case.field, case.id)


def test_valid_base_spec_is_accepted_by_dry_run(api: tuple[Cluster, str]) -> None:
    """The bad cases differ from this spec by one patch each, so this must pass."""
    from .cases import BASE_SPEC

    cluster, ns = api
    cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-",
        input=_doc("base", BASE_SPEC),
    )  # fmt: skip


def test_kubectl_explain_teaches_remediation(api: tuple[Cluster, str]) -> None:
    cluster, _ = api

    def explained() -> str:
        out = cluster.kubectl("explain", "pddeployment.spec.remediation", check=False)
        return out.stdout if out.returncode == 0 and "wedgeAfterSeconds" in out.stdout else ""

    cluster.wait_until("kubectl explain to know PDDeployment", explained, timeout=60)
    text = " ".join(explained().split())
    assert "prefill inflight queue" in text
    for field in ("mode", "scrapeIntervalSeconds", "actions", "maxUnavailableDecode",
                  "maxActionsPerHour", "restartAfterSeconds", "cooldownSeconds"):  # fmt: skip
        assert field in text
    assert "Enforce acts; DryRun records what it would do" in text


def test_kubectl_explain_teaches_sglang_pod_knobs(api: tuple[Cluster, str]) -> None:
    cluster, _ = api

    def explained() -> str:
        out = cluster.kubectl("explain", "pddeployment.spec.sglang", "--recursive=false",
                              check=False)  # fmt: skip
        return out.stdout if out.returncode == 0 and "shmSize" in out.stdout else ""

    cluster.wait_until("kubectl explain to know spec.sglang", explained, timeout=60)
    text = " ".join(explained().split())
    for field in ("cache", "shmSize", "startupTimeoutSeconds"):
        assert field in text
    assert "/ready" in text and "/dev/shm" in text
    cache = cluster.kubectl("explain", "pddeployment.spec.sglang.cache").stdout
    cache = " ".join(cache.split())
    assert "HF_HOME=/cache/huggingface" in cache and "persistentVolumeClaim" in cache


def test_network_allow_from_round_trips_and_kubectl_explain_teaches_it(
    api: tuple[Cluster, str],
) -> None:
    from .cases import BASE_SPEC

    cluster, ns = api
    gateways = [
        {"podSelector": {"matchLabels": {"app": "gateway"}}},
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}},
    ]
    spec = {**BASE_SPEC, "network": {"allowFrom": gateways}}
    doc = {"apiVersion": constants.API_VERSION, "kind": constants.KIND,
           "metadata": {"name": "gw"}, "spec": spec}  # fmt: skip
    with applied(cluster, ns, doc) as stored:
        assert stored["network"] == {"allowFrom": gateways}
        assert parse_spec(stored) == parse_spec(spec)

    def explained() -> str:
        out = cluster.kubectl("explain", "pddeployment.spec.network", check=False)
        return out.stdout if out.returncode == 0 and "allowFrom" in out.stdout else ""

    text = " ".join(cluster.wait_until("kubectl explain spec.network", explained, 60).split())
    assert "/generate on that port is not authenticated" in text.replace("`", "")
    peer = cluster.kubectl("explain", "pddeployment.spec.network.allowFrom").stdout
    peer = " ".join(peer.split())
    assert "namespaceSelector" in peer and "podSelector" in peer
    assert "podSelector alone: those pods in the PDDeployment's own namespace" in peer


def test_status_subresource_printer_columns_and_scale(api: tuple[Cluster, str]) -> None:
    cluster, ns = api
    doc = EXAMPLES["minimal-cpu.yaml"]
    name = doc["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    try:
        status = parse_status({
            "observedGeneration": 1, "phase": "Wedged", "wedgedRooms": 3,
            "conditions": [{"type": "Wedged", "status": "True", "reason": "InflightStuck",
                            "lastTransitionTime": "2026-01-02T03:04:05Z"}],
            "prefill": {"replicas": 1, "readyReplicas": 1, "summary": "1/1"},
            "decode": {"replicas": 2, "readyReplicas": 1, "cordonedReplicas": 1,
                       "summary": "1/2", "selector": "pdwarden.dev/role=decode"},
            "wedges": [{"pod": "p-0", "role": "prefill", "reason": "InflightStuck", "rooms": 3,
                        "oldestSeconds": 75.5, "since": "2026-01-02T03:04:05Z"}],
            "remediation": {"history": [{"time": "2026-01-02T03:04:05Z",
                                         "action": "CordonDecode", "pod": "d-1"}]},
        })  # fmt: skip
        cluster.kubectl(
            "patch", "pdd", name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status_to_wire(status)}),
        )  # fmt: skip
        got = json.loads(cluster.kubectl("get", "pdd", name, "-n", ns, "-o", "json").stdout)
        assert parse_status(got["status"]) == status  # nothing pruned, nothing added

        table = cluster.kubectl("get", "pdd", name, "-n", ns, "-o", "wide").stdout.split()
        for word in ("ENGINE", "PREFILL", "DECODE", "WEDGED", "PHASE", "AGE",
                     "pdworker", "1/1", "1/2", "3", "Wedged", "Enforce"):  # fmt: skip
            assert word in table

        cluster.kubectl("scale", "pdd", name, "-n", ns, "--replicas=3")
        got = json.loads(cluster.kubectl("get", "pdd", name, "-n", ns, "-o", "json").stdout)
        assert got["spec"]["decode"]["replicas"] == 3
        refused = cluster.kubectl("scale", "pdd", name, "-n", ns, "--replicas=0", check=False)
        assert refused.returncode != 0 and "spec.decode.replicas" in refused.stderr
    finally:
        cluster.kubectl("delete", "pdd", name, "-n", ns, check=False)
