"""ownership: a pod is ours only through its owner chain, never by its labels alone."""

from __future__ import annotations

from typing import Any

from pdwarden.ownership import Workloads, owned_by, owned_chain, selector

OWNER = "uid-pdd"


def sts(name: str, uid: str, replicas: int, owner: str = OWNER) -> dict[str, Any]:
    meta = {"name": name, "uid": uid, "ownerReferences": [{"uid": owner}]}
    return {"spec": {"replicas": replicas}, "metadata": meta}


def pod(name: str, kind: str = "StatefulSet", owner: str = "pd-decode", uid: str = "uid-sts",
        controller: bool = True) -> dict[str, Any]:  # fmt: skip
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": uid,
           "controller": controller}  # fmt: skip
    return {"metadata": {"name": name, "ownerReferences": [ref]}}


# As a LIST returns them: items carry no `kind`.
WORKLOADS = Workloads.of(
    [sts("pd-decode", "uid-sts", 2), sts("pd-prefill", "uid-foreign", 2, owner="someone-else")],
    [{"metadata": {"name": "pd-router", "ownerReferences": [{"uid": OWNER}]}}],
    OWNER,
)


def test_the_selector_is_spelled_once() -> None:
    assert selector("pd") == "pdwarden.dev/deployment=pd"
    assert selector("pd", "decode") == "pdwarden.dev/deployment=pd,pdwarden.dev/role=decode"


def test_owned_by_matches_the_uid() -> None:
    assert owned_by(sts("a", "u", 1), OWNER) and not owned_by(sts("a", "u", 1, "x"), OWNER)
    assert not owned_by({"metadata": {}}, OWNER)


def test_statefulset_pods_are_ours_only_by_owned_controller_and_ordinal() -> None:
    assert owned_chain(pod("pd-decode-0"), WORKLOADS)
    assert owned_chain(pod("pd-decode-1"), WORKLOADS)
    assert not owned_chain(pod("pd-decode-2"), WORKLOADS)  # beyond spec.replicas
    assert not owned_chain(pod("pd-decode-01"), WORKLOADS)
    assert not owned_chain(pod("pd-decode-x"), WORKLOADS)
    assert not owned_chain(pod("evil-0", owner="evil"), WORKLOADS)  # name does not match the uid's
    assert not owned_chain(pod("pd-prefill-0", owner="pd-prefill", uid="uid-foreign"), WORKLOADS)
    assert not owned_chain(pod("pd-decode-0", controller=False), WORKLOADS)
    assert not owned_chain({"metadata": {"name": "pd-decode-0"}}, WORKLOADS)  # labels only


def test_router_pods_are_ours_through_a_replicaset_of_an_owned_deployment() -> None:
    assert owned_chain(pod("pd-router-abc-xyz", "ReplicaSet", "pd-router-abc", "rs"), WORKLOADS)
    assert not owned_chain(pod("r", "ReplicaSet", "other-abc", "rs"), WORKLOADS)
