"""The configuration advisor in whole cycles, in-process: the real shells over fakes.

A pod whose own settings switch its engine's safety net off (here SGLang's decode waiting timeout
raised to 100000 s, vLLM's KV lease cut to 2 s) gives its PDDeployment or PDRemediationPolicy the
Advisories condition and one ConfigurationAdvisory Warning Event: once, not every cycle, and not
again from an operator that restarted. A clean pod gives neither, and nothing is ever acted on.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from shell_fakes import KubeFake, LeaseWorkers, WorkerFake, cluster

from pdwarden.constants import API_VERSION, KIND, LABEL_DEPLOYMENT, POLICY_KIND, WORKER_PORT
from pdwarden.engines.protocol import AdviceRule
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.handlers.on_policy import PolicyState, policy_cycle
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.events import MAX_ADVISORY_EVENTS, announce_advisories
from pdwarden.remediation.memory import DeploymentMemory
from pdwarden.values import EvictionOutcome, LabelPatch

KEY = b"k" * 32
HUGE_WAIT = {"name": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "value": "100000"}


def sglang_container(role: str, *env: dict[str, str]) -> dict[str, Any]:
    command = ["python3", "-m", "sglang.launch_server", "--model-path", "tiny",
               "--disaggregation-mode", role, "--port", str(WORKER_PORT)]  # fmt: skip
    return {"name": "sglang", "command": command, "env": list(env)}


def sglang_cluster(kube: KubeFake, *flagged: str) -> None:
    """`cluster` with engine sglang; the pods in `flagged` carry the huge waiting timeout."""
    cluster(kube)
    spec = kube.objects[(KIND, "ns", "pd")]["spec"]
    spec.update(engine="sglang", image="lmsysorg/sglang:v0.5.23")
    spec["prefill"]["gpus"] = spec["decode"]["gpus"] = 1
    for (kind, _, name), obj in kube.objects.items():
        if kind == "Pod":
            role = obj["metadata"]["labels"]["pdwarden.dev/role"]
            env = [HUGE_WAIT] if name in flagged else []
            obj["spec"] = {"containers": [sglang_container(role, *env)]}


def cycle(state: OperatorState, kube: KubeFake) -> None:
    asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def condition(obj: dict[str, Any]) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next(c for c in conditions if c["type"] == "Advisories")


def advisory_events(kube: KubeFake) -> list[dict[str, Any]]:
    return [e for e in kube.events if e["reason"] == "ConfigurationAdvisory"]


@pytest.fixture
def kube() -> KubeFake:
    return KubeFake()


def test_a_flagged_pod_gets_the_condition_and_one_event_once(kube: KubeFake) -> None:
    sglang_cluster(kube, "pd-decode-1")
    workers = WorkerFake()
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
    cycle(state, kube)
    c = condition(kube.obj(KIND, "ns", "pd"))
    assert (c["status"], c["reason"]) == ("True", "RiskySettings")
    assert "pd-decode-1: SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 100000" in c["message"]
    assert "pd-decode-0" not in c["message"]
    [event] = advisory_events(kube)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == KIND
    assert event["message"].startswith("pd-decode-1: SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
    assert "srt/disaggregation/common/conn.py:" in event["message"]
    posts = kube.calls["create_event"]
    cycle(state, kube)  # while it lasts: no second Event, not even a refused one
    assert kube.calls["create_event"] == posts
    restarted = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
    cycle(restarted, kube)  # a new process posts it again: the API server refuses the copy
    assert len(advisory_events(kube)) == 1
    assert kube.obj(KIND, "ns", "pd")["status"]["remediation"]["history"] == []  # warning only


def test_clean_pods_get_neither(kube: KubeFake) -> None:
    sglang_cluster(kube)
    workers = WorkerFake()
    cycle(OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY), kube)
    c = condition(kube.obj(KIND, "ns", "pd"))
    assert (c["status"], c["reason"]) == ("False", "NoRiskySettings")
    assert advisory_events(kube) == []


def test_a_new_pod_without_the_setting_ends_it_and_a_new_flagged_one_is_announced(
    kube: KubeFake,
) -> None:
    sglang_cluster(kube, "pd-decode-1")
    workers = WorkerFake()
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
    cycle(state, kube)
    pod = kube.objects[("Pod", "ns", "pd-decode-1")]
    pod["spec"]["containers"][0]["env"] = []  # its replacement, fixed (same name, new uid)
    pod["metadata"]["uid"] = "uid-fixed"
    cycle(state, kube)
    assert condition(kube.obj(KIND, "ns", "pd"))["status"] == "False"
    pod["spec"]["containers"][0]["env"] = [HUGE_WAIT]  # and again, broken
    pod["metadata"]["uid"] = "uid-broken-again"
    cycle(state, kube)
    assert condition(kube.obj(KIND, "ns", "pd"))["status"] == "True"
    assert len(advisory_events(kube)) == 2


def test_a_fleet_is_announced_a_few_at_a_time(kube: KubeFake) -> None:
    """Every pod with the same setting: at most MAX_ADVISORY_EVENTS new Events a cycle."""
    rule = AdviceRule("SomeRule", "SOME_VARIABLE", "srt/x.py:1", "It can go wrong.")
    fleet = [PodAdvice(f"p-{i}", f"u-{i}", rule.advise("1")) for i in range(20)]
    body = cluster(kube)
    mem = DeploymentMemory()
    asyncio.run(announce_advisories(kube, body, mem, fleet))
    assert len(advisory_events(kube)) == MAX_ADVISORY_EVENTS
    asyncio.run(announce_advisories(kube, body, mem, fleet))
    assert len(advisory_events(kube)) == 20
    assert len({e["metadata"]["name"] for e in advisory_events(kube)}) == 20


class NoCordon:
    """ports.ForeignPodApi that is never needed: nothing here is cordoned or evicted."""

    async def set_pod_label(self, namespace: str, patch: LabelPatch) -> str:
        raise AssertionError("an advisory never acts")

    async def evict_pod(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        raise AssertionError("an advisory never acts")

    async def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        return None


def test_a_policy_over_vllm_pods_reports_them_too(kube: KubeFake) -> None:
    short = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"kv_lease_duration": 2}})  # fmt: skip
    for name, role, net in (("v-prefill-0", "prefill", 1), ("v-decode-0", "decode", 2),
                            ("v-prefill-9", "prefill", 1)):  # fmt: skip
        labels = {"app": "v", "role": role}
        if name == "v-prefill-9":  # a PDDeployment's pod: refused, reported by its owner
            labels[LABEL_DEPLOYMENT] = "pd"
        args = ["--kv-transfer-config", short] if role == "prefill" else []
        kube.put({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"containers": [{"name": "vllm", "command": ["vllm", "serve", "m"],
                                     "args": args}]},
            "status": {"phase": "Running", "podIP": f"127.0.{net}.{name[-1]}",
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
    kube.put({
        "apiVersion": API_VERSION, "kind": POLICY_KIND,
        "metadata": {"name": "v", "namespace": "ns"},
        "spec": {"engine": "vllm", "metrics": {"port": WORKER_PORT},
                 "prefillSelector": {"matchLabels": {"app": "v", "role": "prefill"}},
                 "decodeSelector": {"matchLabels": {"app": "v", "role": "decode"}},
                 "remediation": {"mode": "DryRun", "scrapeIntervalSeconds": 1}},
    })  # fmt: skip
    workers = LeaseWorkers()
    state = PolicyState(client=kube, workers=workers, admin=workers, foreign=NoCordon())
    for _ in range(2):
        asyncio.run(policy_cycle(state, kube.obj(POLICY_KIND, "ns", "v")))
    c = condition(kube.obj(POLICY_KIND, "ns", "v"))
    assert (c["status"], c["reason"]) == ("True", "RiskySettings")
    assert (
        "v-prefill-0: --kv-transfer-config kv_connector_extra_config.kv_lease_duration = 2 s"
        in (c["message"])
    )
    assert "1 setting(s) on 1 pod(s)" in c["message"]
    [event] = advisory_events(kube)
    assert event["involvedObject"]["kind"] == POLICY_KIND
    assert event["message"].startswith("v-prefill-0: ")
