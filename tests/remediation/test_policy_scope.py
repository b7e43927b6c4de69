"""Which foreign pods a PDRemediationPolicy may act on, and its decode budget (pure, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pdwarden.api import PDRemediationPolicySpec, parse_policy_spec
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_SERVING
from pdwarden.remediation.decide import plan
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.policy.scope import (
    ForeignPod,
    conflict_message,
    decode_budget_of,
    decode_pods_for_plan,
    foreign_pod,
    select,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def policy(app: str = "sg", **extra: Any) -> PDRemediationPolicySpec:
    return parse_policy_spec({
        "engine": "sglang",
        "prefillSelector": {"matchLabels": {"app": app, "role": "prefill"}},
        "decodeSelector": {"matchLabels": {"app": app, "role": "decode"}},
        "metrics": {"port": 30000},
        **extra,
    })  # fmt: skip


def pod(name: str, ready: bool = True, /, **labels: str) -> ForeignPod:
    """A pod read the way the operator reads one from the API server."""
    return foreign_pod({
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })  # fmt: skip


def pods_of(app: str, prefill: int, decode: int) -> list[ForeignPod]:
    return [pod(f"{app}-p{i}", app=app, role="prefill") for i in range(prefill)] + [
        pod(f"{app}-d{i}", app=app, role="decode") for i in range(decode)
    ]


def names(pods: tuple[ForeignPod, ...]) -> list[str]:
    return [p.name for p in pods]


def test_selects_each_role_and_ignores_the_rest() -> None:
    pods = [*pods_of("sg", 1, 2), *pods_of("other", 1, 1), pod("router", app="sg", role="router")]
    scope = select("a", policy(), {"a": policy()}, pods)
    assert names(scope.prefill) == ["sg-p0"]
    assert names(scope.decode) == ["sg-d0", "sg-d1"]
    assert scope.refused == ()
    assert conflict_message(scope) == ""


def test_never_a_pod_of_a_pddeployment() -> None:
    pdd_label = pod("x-d0", app="sg", role="decode", **{LABEL_DEPLOYMENT: "x"})
    managed = pod("x-d1", app="sg", role="decode", **{"app.kubernetes.io/managed-by": "pdwarden"})
    scope = select("a", policy(), {}, [pdd_label, managed, *pods_of("sg", 0, 1)])
    assert names(scope.decode) == ["sg-d0"]
    assert [(r.pod, r.reason) for r in scope.refused] == [
        ("x-d0", "OwnedByPDDeployment"),
        ("x-d1", "OwnedByPDDeployment"),
    ]
    # ...also when only an owner reference gives it away.
    obj = {"metadata": {"name": "y", "uid": "u", "labels": {"app": "sg", "role": "decode"},
                        "ownerReferences": [{"apiVersion": "pdwarden.dev/v1alpha1",
                                             "kind": "PDDeployment", "name": "y"}]}}  # fmt: skip
    assert select("a", policy(), {}, [foreign_pod(obj)]).refused[0].reason == "OwnedByPDDeployment"


def test_a_pod_both_selectors_match_is_refused() -> None:
    spec = parse_policy_spec({
        "engine": "sglang", "metrics": {"port": 1},
        "prefillSelector": {"matchLabels": {"app": "sg"}},
        "decodeSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
    })  # fmt: skip
    both = pod("odd", app="sg", tier="x")
    scope = select("a", spec, {}, [both, pod("p", app="sg"), pod("d", tier="y")])
    assert [(r.pod, r.reason) for r in scope.refused] == [("odd", "BothRoles")]
    assert (names(scope.prefill), names(scope.decode)) == (["p"], ["d"])


def test_two_policies_selecting_a_pod_both_refuse_it_and_name_each_other() -> None:
    wide = parse_policy_spec({
        "engine": "sglang", "metrics": {"port": 1},
        "prefillSelector": {"matchLabels": {"role": "prefill"}},
        "decodeSelector": {"matchLabels": {"role": "decode"}},
    })  # fmt: skip
    policies = {"narrow": policy(), "wide": wide}
    pods = [*pods_of("sg", 1, 2), *pods_of("other", 0, 1)]
    narrow = select("narrow", policy(), policies, pods)
    broad = select("wide", wide, policies, pods)
    assert narrow.prefill == narrow.decode == ()
    assert {r.pod: r.policies for r in narrow.refused} == {
        "sg-p0": ["wide"], "sg-d0": ["wide"], "sg-d1": ["wide"]}  # fmt: skip
    assert names(broad.decode) == ["other-d0"]  # the pod only it selects stays its own
    assert {r.pod: r.policies for r in broad.refused} == {
        "sg-p0": ["narrow"], "sg-d0": ["narrow"], "sg-d1": ["narrow"]}  # fmt: skip
    assert "also selected by wide" in conflict_message(narrow)
    assert "also selected by narrow" in conflict_message(broad)


def test_a_policy_that_is_off_claims_nothing() -> None:
    off = policy(remediation={"mode": "Off"})
    scope = select("a", policy(), {"a": policy(), "b": off}, pods_of("sg", 1, 1))
    assert scope.refused == () and len(scope.decode) == 1


@given(order=st.permutations(["a", "b", "c"]), pod_order=st.permutations(range(4)))
def test_conflict_outcome_is_independent_of_listing_order(
    order: list[str], pod_order: list[int]
) -> None:
    specs = {"a": policy(), "b": policy(), "c": policy("zz")}
    pods = pods_of("sg", 2, 2)
    shuffled = [pods[i] for i in pod_order]
    result = {n: select(n, specs[n], {k: specs[k] for k in order}, shuffled) for n in specs}
    assert [r.policies for r in result["a"].refused] == [["b"]] * 4
    assert [r.policies for r in result["b"].refused] == [["a"]] * 4
    assert result["c"].refused == ()


def test_budget_counts_every_matched_decode_pod_including_refused_ones() -> None:
    spec = policy(remediation={"maxUnavailableDecode": "50%"})
    other = policy("zz")
    pods = [pod(f"d{i}", app="sg", role="decode") for i in range(3)]
    pods.append(pod("d3", False, app="sg", role="decode", shared="yes"))
    rival = parse_policy_spec({
        "engine": "sglang", "metrics": {"port": 1},
        "prefillSelector": {"matchLabels": {"nothing": "here"}},
        "decodeSelector": {"matchLabels": {"shared": "yes"}},
    })  # fmt: skip
    scope = select("a", spec, {"a": spec, "rival": rival, "zz": other}, pods)
    assert [r.pod for r in scope.refused] == ["d3"]
    budget = decode_budget_of(spec, scope)
    assert (budget.total, budget.matched, budget.unavailable, budget.left) == (2, 4, ("d3",), 1)
    assert budget.allows("d0") and budget.allows("d3")


def test_cordoned_label_uses_budget_and_a_used_budget_refuses_new_pods() -> None:
    spec = policy(remediation={"maxUnavailableDecode": 1})
    cordoned = pod("d0", app="sg", role="decode", **{LABEL_SERVING: "false"})
    scope = select("a", spec, {}, [cordoned, pod("d1", app="sg", role="decode")])
    budget = decode_budget_of(spec, scope)
    assert budget.unavailable == ("d0",) and budget.left == 0
    assert budget.allows("d0")  # evicting the cordoned pod takes nothing more out
    assert not budget.allows("d1")


def test_plan_counts_refused_pods_in_the_budget_but_never_acts_on_them() -> None:
    """The shared remediation.plan, fed by the policy path: its budget spans the whole pool."""
    spec = policy(remediation={"mode": "Enforce", "maxUnavailableDecode": 1})
    pods = [pod("d0", app="sg", role="decode"), pod("d1", app="sg", role="decode"),
            pod("d2", app="sg", role="decode", **{LABEL_DEPLOYMENT: "x"}),
            pod("d3", False, app="sg", role="decode")]  # fmt: skip
    scope = select("a", spec, {}, pods)
    decodes = decode_pods_for_plan(spec, scope, {}, NOW)
    assert [d.name for d in decodes if d.stale] == ["d2"]
    detection = Detection(stalled_decodes=frozenset({"d0", "d2"}))
    out = plan(spec.remediation, detection, decodes, [], NOW, decode_replicas=len(decodes))
    # d3 (not ready) already uses the one unit of budget: d0 is held back, d2 never considered.
    assert out.actions == ()
    assert any("CordonDecode d0" in h and "budget" in h for h in out.held_back)
    assert not any("d2" in h for h in out.held_back)


def test_cordoned_since_comes_from_the_ledger_else_now() -> None:
    spec = policy()
    labelled = {"app": "sg", "role": "decode", LABEL_SERVING: "false"}
    scope = select("a", spec, {}, [pod("d0", **labelled), pod("d1", **labelled),
                                   pod("d2", app="sg", role="decode")])  # fmt: skip
    earlier = NOW - timedelta(minutes=5)
    decodes = {d.name: d for d in decode_pods_for_plan(spec, scope, {"d0": earlier}, NOW)}
    assert decodes["d0"].cordoned_since == earlier
    assert decodes["d1"].cordoned_since == NOW
    assert decodes["d2"].cordoned_since is None


def test_foreign_pod_reads_the_api_object() -> None:
    obj = {
        "metadata": {"name": "d0", "uid": "u1", "resourceVersion": "42",
                     "labels": {"app": "sg"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"podIP": "10.0.0.5",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    p = foreign_pod(obj)
    assert (p.name, p.uid, p.resource_version, p.ip) == ("d0", "u1", "42", "10.0.0.5")
    assert p.ready and p.terminating and not p.owned_by_pdwarden
    assert not foreign_pod({"metadata": {"name": "x"}}).ready
