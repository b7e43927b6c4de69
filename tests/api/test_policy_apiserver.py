"""The PDRemediationPolicy CRD against a real kube-apiserver: installs, accepts, refuses, explains.

As in test_crd_apiserver.py, every refusal comes from the API server (schema, CEL, strict field
validation); nothing of pdwarden runs here except the generated YAML.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e.fixtures import Cluster

from pdwarden import constants
from pdwarden.api import parse_policy_spec, parse_policy_status, to_wire
from pdwarden.api.base import prune_empty

from .apiserver import applied, assert_refused, document, install
from .cases import POLICY_CRD_FILE, load_policy_examples
from .policy_cases import BAD_POLICIES, BASE_POLICY, BadPolicy

pytestmark = pytest.mark.cluster
EXAMPLES = load_policy_examples()


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[tuple[Cluster, str]]:
    for ns in install(cluster, POLICY_CRD_FILE, constants.POLICY_CRD_NAME, "pdrp-api"):
        yield cluster, ns


def _doc(name: str, spec: dict[str, Any]) -> str:
    return document(constants.POLICY_KIND, name, spec)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_applies_and_round_trips_with_defaults(
    api: tuple[Cluster, str], example: str
) -> None:
    cluster, ns = api
    doc = EXAMPLES[example]
    with applied(cluster, ns, doc) as stored:
        expected = parse_policy_spec(doc["spec"])
        # The API server filled in exactly the defaults the models declare.
        assert stored == prune_empty(to_wire(expected))
        assert parse_policy_spec(stored) == expected
        assert stored["remediation"]["mode"] == "DryRun"


def test_minimal_policy_defaults_to_dry_run_on_the_server(api: tuple[Cluster, str]) -> None:
    cluster, ns = api
    out = cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", ns, "-o", "json", "-f", "-",
        input=_doc("base", BASE_POLICY),
    )  # fmt: skip
    spec = json.loads(out.stdout)["spec"]
    assert spec["remediation"]["mode"] == "DryRun"
    assert spec["cordon"] == {"labelKey": "pdwarden.dev/serving", "servingValue": "true",
                              "cordonedValue": "false"}  # fmt: skip
    assert spec["metrics"] == {"port": 30000, "path": "/metrics", "scheme": "http"}


@pytest.mark.parametrize("case", BAD_POLICIES, ids=lambda c: c.id)
def test_api_server_refuses_bad_policy_naming_the_field(
    api: tuple[Cluster, str], case: BadPolicy
) -> None:
    cluster, ns = api
    assert_refused(cluster, ns, _doc(f"bad-{case.id}", case.spec), case.field, case.id)


def test_kubectl_explain_teaches_the_cordon(api: tuple[Cluster, str]) -> None:
    cluster, _ = api

    def explained() -> str:
        out = cluster.kubectl("explain", "pdrp.spec.cordon", check=False)
        return out.stdout if out.returncode == 0 and "serviceRef" in out.stdout else ""

    cluster.wait_until("kubectl explain to know PDRemediationPolicy", explained, timeout=60)
    text = " ".join(explained().split())
    assert "readiness gate cannot" in text or "cannot get a readiness gate" in text
    assert "CordonUnavailable" in text
    mode = " ".join(cluster.kubectl("explain", "pdrp.spec.remediation.mode").stdout.split())
    assert "A policy starts in DryRun" in mode


def test_status_and_printer_columns(api: tuple[Cluster, str]) -> None:
    cluster, ns = api
    cluster.kubectl(
        "apply", "--server-side", "-n", ns, "-f", "-", input=_doc("glance", BASE_POLICY)
    )
    try:
        status = parse_policy_status({
            "observedGeneration": 1, "wedgedRooms": 2,
            "conditions": [{"type": "Conflict", "status": "True", "reason": "PodsSelectedTwice",
                            "lastTransitionTime": "2026-01-02T03:04:05Z"}],
            "prefill": {"matched": 2, "eligible": 2, "ready": 2},
            "decode": {"matched": 4, "eligible": 3, "ready": 4, "cordoned": 1},
            "refused": [{"pod": "d-0", "reason": "SelectedByAnotherPolicy", "policies": ["x"]}],
            "heldBack": [{"time": "2026-01-02T03:04:05Z", "action": "RestartDecode",
                          "pod": "d-1", "reason": "PodDisruptionBudget d-pdb"}],
            "remediation": {"actionsLastHour": 7},
        })  # fmt: skip
        cluster.kubectl(
            "patch", "pdrp", "glance", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": to_wire(status)}),
        )  # fmt: skip
        got = json.loads(cluster.kubectl("get", "pdrp", "glance", "-n", ns, "-o", "json").stdout)
        assert parse_policy_status(got["status"]) == status  # nothing pruned, nothing added
        header, row = cluster.kubectl("get", "pdrp", "glance", "-n", ns).stdout.splitlines()
        assert header.split() == ["NAME", "MODE", "ENGINE", "PREFILL", "DECODE", "WEDGED",
                                  "ACTIONS/H", "AGE"]  # fmt: skip
        assert row.split()[:7] == ["glance", "DryRun", "sglang", "2", "4", "2", "7"]
    finally:
        cluster.kubectl("delete", "pdrp", "glance", "-n", ns, check=False)


LABEL_SETS = [
    {"app": "sg", "role": "prefill"},
    {"app": "sg", "role": "decode"},
    {"app": "sg", "role": "decode", "tier": "gold"},
    {"app": "sg", "role": "decode", "tier": "silver", "pdwarden.dev/serving": "true"},
    {"app": "other", "role": "decode"},
    {"role": "decode", "example.com/shard": "a-1"},
]
SELECTORS = [
    {"matchLabels": {"app": "sg", "role": "decode"}},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "bronze"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
    {"matchLabels": {"role": "decode"},
     "matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
    {"matchLabels": {"role": "decode"},
     "matchExpressions": [{"key": "pdwarden.dev/serving", "operator": "NotIn", "values": ["false"]},
                          {"key": "app", "operator": "In", "values": ["sg"]}]},
    {"matchExpressions": [{"key": "example.com/shard", "operator": "In", "values": ["a-1"]}]},
]  # fmt: skip


def test_selector_matching_and_query_agree_with_the_api_server(api: tuple[Cluster, str]) -> None:
    """The loop lists pods with to_query() and re-checks with matches(): both mean what the API
    server means. Pods are bound to a node that does not exist, so nothing runs them."""
    from pdwarden.api import LabelSelector

    cluster, ns = api
    pods = [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"sel-{i}", "labels": {**labels, "selector-test": "yes"}},
         "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]}}
        for i, labels in enumerate(LABEL_SETS)
    ]  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(pods))
    for raw in SELECTORS:
        selector = LabelSelector.model_validate(raw)
        query = selector.to_query() + ",selector-test=yes"
        out = cluster.kubectl("get", "pods", "-n", ns, "-l", query, "-o", "name")
        server = {line.removeprefix("pod/") for line in out.stdout.split()}
        ours = {f"sel-{i}" for i, labels in enumerate(LABEL_SETS) if selector.matches(labels)}
        assert server == ours, (raw, query)
        assert 0 < len(ours) < len(LABEL_SETS), raw  # every selector tells pods apart
    cluster.kubectl("delete", "pods", "-n", ns, "-l", "selector-test=yes", "--wait=false")
