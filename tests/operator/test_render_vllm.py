"""engine: vllm renders stock vLLM PD pods (checked against vLLM 0.32.0's flags and env)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_render import by_kind, container, example

from pdwarden.api import parse_spec
from pdwarden.constants import WORKER_PORT
from pdwarden.render import Owner, render_deployment

OWNER = Owner(name="demo", namespace="ns1", uid="uid-1")


def _pods(patch: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    spec = example("vllm.yaml")
    spec.update(patch or {})
    sts = by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")
    return {role: sts[f"demo-{role}"]["spec"]["template"]["spec"] for role in ("prefill", "decode")}


def _flag(cmd: list[str], name: str) -> str:
    assert cmd.count(name) == 1, (name, cmd)
    return cmd[cmd.index(name) + 1]


@pytest.mark.parametrize(
    ("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")]
)
def test_vllm_pods_serve_with_the_nixl_connector(role: str, kv_role: str) -> None:
    c = _pods()[role]["containers"][0]
    cmd = c["command"]
    assert cmd[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert _flag(cmd, "--host") == "$(POD_IP)" and _flag(cmd, "--port") == str(WORKER_PORT)
    assert _flag(cmd, "--served-model-name") == "llama-3.1-8b"
    assert json.loads(_flag(cmd, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": kv_role,
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "recompute",
    }
    assert "--tensor-parallel-size" not in cmd  # one GPU
    assert cmd[-4:] == ["--gpu-memory-utilization", "0.9", "--max-model-len", "8192"]


def test_the_side_channel_is_the_pod_ip_from_the_downward_api_on_the_bootstrap_port() -> None:
    c = _pods()["decode"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names = [e["name"] for e in c["env"]]
    # $(POD_IP) expands only from a variable defined earlier in the list.
    assert names.index("POD_IP") < names.index("VLLM_NIXL_SIDE_CHANNEL_HOST")
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["value"] == "$(POD_IP)"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
    assert {"name": "bootstrap", "containerPort": 5600, "protocol": "TCP"} in c["ports"]


def test_vllm_pods_get_caches_shm_and_probes_that_generate_nothing() -> None:
    pod = _pods()["prefill"]
    c = pod["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/cache"] == "cache" and mounts["/dev/shm"] == "dshm"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/cache/vllm" and env["HF_HOME"] == "/cache/huggingface"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["cache"]["emptyDir"] == {"sizeLimit": "60Gi"}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["httpGet"]["path"] == "/health", kind
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800


def test_tensor_parallelism_follows_gpus_and_a_cpu_build_gets_cpu_buffers() -> None:
    spec = example("vllm.yaml")
    spec["decode"] = {**spec["decode"], "gpus": 4}
    spec["vllm"] = {**spec["vllm"], "kvBufferDevice": "cpu", "kvLoadFailurePolicy": "fail"}
    sts = by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")
    cmd = container(sts["demo-decode"])["command"]
    assert _flag(cmd, "--tensor-parallel-size") == "4"
    kv = json.loads(_flag(cmd, "--kv-transfer-config"))
    assert kv["kv_buffer_device"] == "cpu" and kv["kv_load_failure_policy"] == "fail"


def test_a_set_lease_reaches_both_sides_and_an_unset_one_leaves_vllms_default() -> None:
    spec = example("vllm.yaml")
    assert "kv_connector_extra_config" not in json.loads(
        _flag(container(by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")
                        ["demo-prefill"])["command"], "--kv-transfer-config")
    )  # fmt: skip
    spec["vllm"] = {**spec["vllm"], "kvLeaseSeconds": 120}
    sts = by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")
    for role in ("prefill", "decode"):
        kv = json.loads(_flag(container(sts[f"demo-{role}"])["command"], "--kv-transfer-config"))
        assert kv["kv_connector_extra_config"] == {"kv_lease_duration": 120}, role


def test_the_router_speaks_vllms_pd_protocol() -> None:
    objs = render_deployment(OWNER, parse_spec(example("vllm.yaml")))
    cmd = container(by_kind(objs, "Deployment")["demo-router"])["command"]
    assert cmd[:2] == ["pdworker", "router"]
    assert _flag(cmd, "--engine") == "vllm"
