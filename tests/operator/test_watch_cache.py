"""The watch cache that serves the shells' lists (k8s.cache, k8s.cached, k8s.selectors), the
watch stream's line splitting (k8s.watching) and the resync gate (reconciling.resync).

The cluster side (a real API server feeding the cache, the operator's steady-state traffic) is
e2e/tests/test_fleet_kwok.py.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest

from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE
from pdwarden.k8s import selectors
from pdwarden.k8s.cache import ObjectCache
from pdwarden.k8s.cached import CachedKube
from pdwarden.k8s.watching import lines
from pdwarden.reconciling.resync import ROTATION_FULL_EVERY, ResyncGate


def pod(
    name: str, deployment: str | None, *, ns: str = "ns", rv: int = 1, role: str | None = None
) -> dict[str, Any]:
    all_labels = {LABEL_ROLE: role} if role else {}
    if deployment is not None:
        all_labels[LABEL_DEPLOYMENT] = deployment
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": all_labels, "uid": f"u-{name}",
                     "resourceVersion": str(rv), "managedFields": [{"manager": "x"}]},
        "status": {"podIP": "127.1.2.3"},
    }  # fmt: skip


def names(objs: list[dict[str, Any]] | None) -> list[str]:
    assert objs is not None
    return [o["metadata"]["name"] for o in objs]


# -- selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": "x"}, False),
        ("pdwarden.dev/deployment=pd,pdwarden.dev/role=decode", {
            "pdwarden.dev/deployment": "pd", "pdwarden.dev/role": "decode"}, True),
        ("", {"anything": "x"}, True),
    ],
)  # fmt: skip
def test_selector_matches_as_the_api_server_does(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    parsed = selectors.parse(selector)
    assert parsed is not None
    assert parsed.matches(labels) is matches


@pytest.mark.parametrize("selector", ["a in (x,y)", "a notin (x)", "a=1,,b=2", "a=b=c", "=x"])
def test_selectors_the_cache_cannot_match_exactly_are_refused(selector: str) -> None:
    assert selectors.parse(selector) is None


# -- the cache -----------------------------------------------------------------------------


def test_cache_serves_a_deployments_children_by_selector_after_the_first_list() -> None:
    cache = ObjectCache()
    assert cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd") is None  # not listed yet
    cache.replace("Pod", "", [pod("pd-decode-0", "pd", role="decode"),
                              pod("pd-prefill-0", "pd", role="prefill"),
                              pod("other-0", "other"), pod("pd-x", "pd", ns="ns2")])  # fmt: skip
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == [
        "pd-decode-0", "pd-prefill-0"]  # fmt: skip
    got = cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd,{LABEL_ROLE}=decode")
    assert names(got) == ["pd-decode-0"]
    assert "managedFields" not in got[0]["metadata"]  # type: ignore[index]
    # What it cannot answer exactly goes to the API server.
    assert cache.select("Pod", "ns", f"{LABEL_ROLE}=decode") is None  # not pinned to one
    assert cache.select("Secret", "ns", f"{LABEL_DEPLOYMENT}=pd") is None
    assert cache.select("Pod", "", f"{LABEL_DEPLOYMENT}=pd") is None


def test_events_move_objects_between_deployments_and_count_changes() -> None:
    cache = ObjectCache()
    cache.replace("Pod", "", [pod("a", "pd")])
    v_pd, v_other = cache.version("ns", "pd"), cache.version("ns", "other")
    cache.apply("Pod", "MODIFIED", pod("a", "other", rv=2))  # relabelled
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == []
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=other")) == ["a"]
    assert cache.version("ns", "pd") > v_pd and cache.version("ns", "other") > v_other
    cache.apply("Pod", "DELETED", pod("a", "other", rv=3))
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=other")) == []


def test_a_fresh_list_replaces_what_the_scope_held() -> None:
    cache = ObjectCache(namespaces=["ns", "ns2"])
    cache.replace("StatefulSet", "ns", [pod("gone", "pd"), pod("kept", "pd")])
    cache.replace("StatefulSet", "ns2", [pod("elsewhere", "pd", ns="ns2")])
    cache.replace("StatefulSet", "ns", [pod("kept", "pd", rv=5)])  # a relist after 410 Gone
    assert names(cache.select("StatefulSet", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["kept"]
    assert names(cache.select("StatefulSet", "ns2", f"{LABEL_DEPLOYMENT}=pd")) == ["elsewhere"]
    assert cache.select("StatefulSet", "ns3", f"{LABEL_DEPLOYMENT}=pd") is None  # not watched


def test_our_own_writes_are_folded_in_only_when_newer() -> None:
    cache = ObjectCache()
    cache.replace("Pod", "", [pod("a", "pd", rv=10)])
    older = pod("a", "pd", rv=9)
    older["status"]["podIP"] = "127.9.9.9"
    cache.written("Pod", older)
    assert cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")[0]["status"]["podIP"] == (  # type: ignore[index]
        "127.1.2.3"
    )
    newer = pod("a", "pd", rv=11)
    newer["status"]["conditions"] = [{"type": "pdwarden.dev/serving", "status": "True"}]
    cache.written("Pod", newer)
    got = cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")
    assert got is not None and got[0]["status"]["conditions"][0]["status"] == "True"
    cache.written("Pod", pod("new", "pd", rv=50))  # created by us: held before the watch says
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["a", "new"]


def test_a_write_echoed_after_the_watch_saw_the_deletion_does_not_resurrect_the_object() -> None:
    cache = ObjectCache()
    cache.replace("Pod", "", [pod("a", "pd", rv=10), pod("b", "pd", rv=11)])
    cache.apply("Pod", "DELETED", pod("a", "pd", rv=20))
    cache.written("Pod", pod("a", "pd", rv=15))  # our write, answered before the delete
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["b"]
    cache.written("Pod", pod("a", "pd", rv=30))  # created again by us, after the delete
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["a", "b"]
    cache.replace("Pod", "", [pod("a", "pd", rv=30)])  # a relist: b went at a version unknown
    cache.written("Pod", pod("b", "pd", rv=99))
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["a"]
    cache.apply("Pod", "ADDED", pod("b", "pd", rv=100))  # the watch always wins
    assert names(cache.select("Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["a", "b"]


def test_wait_change_wakes_on_a_child_event_and_times_out_otherwise() -> None:
    asyncio.run(_wait_change())


async def _wait_change() -> None:
    cache = ObjectCache()
    cache.replace("Pod", "", [pod("a", "pd")])
    since = cache.version("ns", "pd")
    assert await cache.wait_change("ns", "pd", since, 0.05) is False
    waiter = asyncio.create_task(cache.wait_change("ns", "pd", since, 10))
    await asyncio.sleep(0)
    cache.apply("Pod", "MODIFIED", pod("a", "pd", rv=2))
    assert await asyncio.wait_for(waiter, 1) is True
    cache.apply("Pod", "MODIFIED", pod("b", "other", rv=3))  # another deployment's child
    assert await cache.wait_change("ns", "pd", cache.version("ns", "pd"), 0.05) is False


class _Api:
    """The one verb these tests need of the API server."""

    async def list(self, api_version: str, kind: str, ns: str, sel: str) -> list[dict[str, Any]]:
        return [pod("in-api", "pd")]


def test_cached_kube_serves_lists_and_passes_the_rest_through() -> None:
    asyncio.run(_cached_kube())


async def _cached_kube() -> None:
    fake = _Api()
    cache = ObjectCache()
    kube = CachedKube(fake, cache)  # type: ignore[arg-type]
    # Not synced yet: the API server answers.
    assert names(await kube.list("v1", "Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["in-api"]
    cache.replace("Pod", "", [pod("in-cache", "pd")])
    assert names(await kube.list("v1", "Pod", "ns", f"{LABEL_DEPLOYMENT}=pd")) == ["in-cache"]
    # A selector without the deployment label, or another kind, still goes to the API server.
    assert names(await kube.list("v1", "Pod", "ns", "")) == ["in-api"]
    assert (kube.served, kube.passed) == (1, 2)


def test_lines_splits_a_chunked_stream_and_bounds_a_line() -> None:
    chunks = [b'{"a":', b'1}\n{"b":2}\n', b"\n", b'{"c":3}\n']
    assert [line for group in lines(iter(chunks)) for line in group] == [
        b'{"a":1}', b'{"b":2}', b'{"c":3}']  # fmt: skip
    with pytest.raises(ValueError, match="over 8 bytes"):
        list(lines(iter([b"0123456789"]), limit=8))


# -- the resync gate -----------------------------------------------------------------------


def deployment(rv: str = "5", generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "pd", "namespace": "ns", "uid": "uid-pd",
                         "resourceVersion": rv, "generation": generation}}  # fmt: skip


class _Result:
    def __init__(self, rv: str | None, observed_generation: int = 1) -> None:
        from pdwarden.api import PDDeploymentStatus
        from pdwarden.remediation.record.store import Known

        status = PDDeploymentStatus.model_validate({"observedGeneration": observed_generation})
        self.known = Known(status, rv)


def test_gate_skips_a_pass_over_unchanged_inputs_and_runs_one_on_any_change() -> None:
    cache = ObjectCache()
    cache.replace("Pod", "", [pod("a", "pd")])
    gate = ResyncGate(cache, spacing=5)
    body = deployment(rv="5")
    assert gate.due(body)
    gate.begin(body)
    gate.finished(body, _Result(rv="6"))  # type: ignore[arg-type]
    assert gate.due(body)  # kopf has not yet seen our status write (rv 6)
    body = deployment(rv="6")
    assert not gate.due(body)
    cache.apply("Pod", "MODIFIED", pod("a", "pd", rv=2))
    assert gate.due(body)  # a child changed


def test_gate_never_records_a_pass_that_must_be_repeated() -> None:
    gate = ResyncGate(ObjectCache(), spacing=5)
    body = deployment(rv="5", generation=2)
    gate.begin(body)
    gate.finished(body, _Result(rv="5", observed_generation=1))  # type: ignore[arg-type]
    assert gate.due(body)
    gate.finished(body, None)  # the pass failed
    assert gate.due(body)


def test_without_a_cache_every_check_is_due() -> None:
    gate = ResyncGate(None, spacing=5)
    body = deployment()
    gate.begin(body)
    gate.finished(body, _Result(rv="5"))  # type: ignore[arg-type]
    assert gate.due(copy.deepcopy(body))


def test_after_a_token_key_rotation_the_safety_net_pass_comes_every_minute() -> None:
    rotated = [False]
    gate = ResyncGate(ObjectCache(), spacing=5, rotating=lambda: rotated[0])
    body = deployment(rv="6")
    gate.begin(body)
    gate.finished(body, _Result(rv="6"))  # type: ignore[arg-type]
    done = gate.done["uid-pd"]
    gate.done["uid-pd"] = dataclasses.replace(done, at=done.at - ROTATION_FULL_EVERY - 1)
    assert not gate.due(body)  # unchanged inputs, and the 300 s safety net is not due yet
    rotated[0] = True
    assert gate.due(body)  # a deleted Secret is recreated within a minute (nothing watches it)
