"""Render is pure: from a spec alone we can check every object the operator will write."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden.api import parse_spec
from pdwarden.constants import (
    ANNOTATION_TEMPLATE_HASH,
    CONDITION_SERVING,
    LABEL_DEPLOYMENT,
)
from pdwarden.engines import sglang
from pdwarden.render import Owner, render_deployment
from pdwarden.render.deployment import admin_secret, bootstrap_secret

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner(name="demo", namespace="ns1", uid="uid-1")


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / "examples" / name).read_text())
    return doc["spec"]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return c


def test_cpu_example_renders_every_child_with_owner_and_labels() -> None:
    objs = render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml")))
    kinds = sorted(o["kind"] for o in objs)
    workers = ["Service", "StatefulSet"] * 2
    router = ["ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]
    assert kinds == sorted([*workers, "PodDisruptionBudget", "NetworkPolicy", *router])
    for o in objs:
        assert o["metadata"]["namespace"] == "ns1"
        assert o["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert o["metadata"]["ownerReferences"][0]["controller"] is True
        assert o["metadata"]["labels"][LABEL_DEPLOYMENT] == "demo"
    sts = by_kind(objs, "StatefulSet")
    assert sts["demo-prefill"]["spec"]["replicas"] == 1
    assert sts["demo-decode"]["spec"]["replicas"] == 2
    assert sts["demo-decode"]["spec"]["serviceName"] == "demo-decode"


def test_decode_pods_carry_the_serving_readiness_gate_and_prefill_does_not() -> None:
    sts = by_kind(render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml"))), "StatefulSet")
    decode = sts["demo-decode"]["spec"]["template"]["spec"]
    prefill = sts["demo-prefill"]["spec"]["template"]["spec"]
    assert decode["readinessGates"] == [{"conditionType": CONDITION_SERVING}]
    assert "readinessGates" not in prefill


def test_gpus_become_nvidia_requests_and_limits() -> None:
    sts = by_kind(render_deployment(OWNER, parse_spec(example("gpu.yaml"))), "StatefulSet")
    res = container(sts["demo-decode"])["resources"]
    assert res["limits"]["nvidia.com/gpu"] >= 1
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
    cpu = by_kind(render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml"))), "StatefulSet")
    assert "nvidia.com/gpu" not in str(container(cpu["demo-decode"])["resources"])


def test_pods_are_hardened_and_mount_the_admin_token() -> None:
    sts = by_kind(render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml"))), "StatefulSet")
    pod = sts["demo-prefill"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    secret_vols = [v for v in pod["volumes"] if "secret" in v]
    assert secret_vols == [
        {"name": "admin-token", "secret": {"secretName": "demo-admin", "defaultMode": 0o440}},
        {
            "name": "bootstrap-token",
            "secret": {"secretName": "demo-bootstrap", "defaultMode": 0o440},
        },
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["PDWORKER_ADMIN_TOKEN_FILE"]["value"] == "/var/run/pdwarden/admin/token"
    assert env["PDWORKER_BOOTSTRAP_TOKEN_FILE"]["value"] == "/var/run/pdwarden/bootstrap/token"
    assert pod["automountServiceAccountToken"] is False


def secrets_of(template: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for v in template["spec"]["volumes"] if "secret" in v}


def test_each_role_gets_only_the_tokens_it_uses() -> None:
    spec = example("minimal-cpu.yaml")
    objs = render_deployment(OWNER, parse_spec(spec))
    sts = by_kind(objs, "StatefulSet")
    # The operator calls prefill's admin API; decode only needs the handshake key.
    assert secrets_of(sts["demo-prefill"]["spec"]["template"]) == {"demo-admin", "demo-bootstrap"}
    decode = sts["demo-decode"]["spec"]["template"]
    assert secrets_of(decode) == {"demo-bootstrap"}
    assert "PDWORKER_ADMIN_TOKEN_FILE" not in {
        e["name"] for e in container(sts["demo-decode"])["env"]
    }
    router = by_kind(objs, "Deployment")["demo-router"]["spec"]["template"]
    assert secrets_of(router) == set()
    # A decode armed with the decode-stall fault keeps its admin API (the fault's trigger).
    armed = copy.deepcopy(spec)
    armed["decode"]["env"] = [{"name": "PDWORKER_FAULTS", "value": "decode-stall"}]
    sts = by_kind(render_deployment(OWNER, parse_spec(armed)), "StatefulSet")
    assert secrets_of(sts["demo-decode"]["spec"]["template"]) == {"demo-admin", "demo-bootstrap"}
    # SGLang pods use neither pdworker key for the handshake.
    sts = by_kind(render_deployment(OWNER, parse_spec(example("sglang.yaml"))), "StatefulSet")
    assert "demo-bootstrap" not in secrets_of(sts["demo-decode"]["spec"]["template"])


def test_template_hash_changes_with_env_and_only_for_that_role() -> None:
    base = example("minimal-cpu.yaml")
    changed = copy.deepcopy(base)
    changed["decode"]["env"] = [{"name": "EXTRA", "value": "1"}]
    a = by_kind(render_deployment(OWNER, parse_spec(base)), "StatefulSet")
    b = by_kind(render_deployment(OWNER, parse_spec(changed)), "StatefulSet")

    def h(objs: dict[str, Any], name: str) -> str:
        value: str = objs[name]["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH]
        return value

    assert h(a, "demo-decode") != h(b, "demo-decode")
    assert h(a, "demo-prefill") == h(b, "demo-prefill")
    assert {"name": "EXTRA", "value": "1"} in container(b["demo-decode"])["env"]


def test_scaling_changes_replicas_but_not_the_template_hash() -> None:
    base = example("minimal-cpu.yaml")
    scaled = copy.deepcopy(base)
    scaled["decode"]["replicas"] = 3
    a = by_kind(render_deployment(OWNER, parse_spec(base)), "StatefulSet")["demo-decode"]
    b = by_kind(render_deployment(OWNER, parse_spec(scaled)), "StatefulSet")["demo-decode"]
    assert b["spec"]["replicas"] == 3
    assert a["metadata"]["annotations"] == b["metadata"]["annotations"]


def test_user_env_overrides_operator_env_instead_of_duplicating_it() -> None:
    spec = example("minimal-cpu.yaml")
    spec["prefill"]["env"] = [{"name": "PDWORKER_ADMIN_TOKEN_FILE", "value": "/elsewhere"}]
    sts = by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")
    env = [
        e for e in container(sts["demo-prefill"])["env"] if e["name"] == "PDWORKER_ADMIN_TOKEN_FILE"
    ]
    assert env == [{"name": "PDWORKER_ADMIN_TOKEN_FILE", "value": "/elsewhere"}]


# SGLang's PD launch flags as documented in shared/research/sglang-pd-and-nixl.md §6 and §9.
SGLANG_WORKER_FLAGS = {
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--model-path",
    "--enable-metrics",
}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_renders_stock_pd_launch_flags(role: str) -> None:
    spec = parse_spec(example("sglang.yaml"))
    sts = by_kind(render_deployment(OWNER, spec), "StatefulSet")
    cmd = container(sts[f"demo-{role}"])["command"]
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    assert set(cmd) >= SGLANG_WORKER_FLAGS
    assert cmd[cmd.index("--disaggregation-mode") + 1] == role
    assert cmd[cmd.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert cmd[cmd.index("--disaggregation-bootstrap-port") + 1] == str(
        spec.transfer.bootstrap_port
    )
    assert container(sts[f"demo-{role}"])["image"] == spec.image


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_command_sets_each_flag_once(role: str) -> None:
    spec = parse_spec(example("sglang.yaml"))
    cmd = container(by_kind(render_deployment(OWNER, spec), "StatefulSet")[f"demo-{role}"])[
        "command"
    ]
    flags = [a for a in cmd if a.startswith("--")]
    assert sorted(flags) == sorted(set(flags))
    assert cmd[cmd.index("--tp-size") + 1] == "1"


def _sglang_pod(patch: dict[str, Any], role: str = "decode") -> dict[str, Any]:
    spec = example("sglang.yaml")
    spec.pop("sglang", None)
    spec = {**spec, **patch}
    sts = by_kind(render_deployment(OWNER, parse_spec(spec)), "StatefulSet")[f"demo-{role}"]
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def test_sglang_pods_get_writable_caches_and_shm_sized_for_tensor_parallelism() -> None:
    pod = _sglang_pod({"decode": {"replicas": 2, "gpus": 4}})
    c = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "100Gi"}}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert {"/tmp": "tmp", "/cache": "cache", "/dev/shm": "dshm"}.items() <= mounts.items()
    env = {e["name"]: e.get("value") for e in c["env"]}
    # Every directory SGLang writes to lies on a writable volume (the root filesystem is not).
    for name in ("HF_HOME", "SGLANG_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        assert env[name].startswith("/cache/"), name
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_sglang_cache_from_a_claim_and_an_explicit_shm_size() -> None:
    pod = _sglang_pod(
        {"sglang": {"cache": {"persistentVolumeClaim": "models"}, "shmSize": "3Gi"}}, "prefill"
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}


def test_sglang_probes_are_cheap_and_the_startup_window_fits_a_download() -> None:
    c = _sglang_pod({"sglang": {"startupTimeoutSeconds": 3600}})["containers"][0]
    # /ready runs no generation; /health does (up to SGLang's 20 s), so its timeout is above it.
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["timeoutSeconds"] > 20


def test_pdworker_pods_keep_their_probes_and_volumes() -> None:
    objs = render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml")))
    pod = by_kind(objs, "StatefulSet")["demo-decode"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    # decode needs the KV-handshake key, not the admin token (no decode fault armed here)
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "bootstrap-token"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["timeoutSeconds"] == 2
    assert not {"HF_HOME", "SGLANG_CACHE_DIR"} & {e["name"] for e in c["env"]}


def test_sglang_router_uses_pd_mode_with_kubernetes_discovery() -> None:
    objs = render_deployment(OWNER, parse_spec(example("sglang.yaml")))
    cmd = container(by_kind(objs, "Deployment")["demo-router"])["command"]
    assert cmd[:3] == ["python3", "-m", "sglang_router.launch_router"]
    assert "--pd-disaggregation" in cmd
    assert "--service-discovery" in cmd
    assert "pdwarden.dev/role=prefill" in cmd[cmd.index("--prefill-selector") + 1]
    # Its health checks every 10 s, not its 60 s default: a restarted pod is routed to sooner.
    assert cmd[cmd.index("--health-check-interval-secs") + 1] == "10"


def test_admin_secret_holds_the_token_base64_and_is_owned() -> None:
    secret = admin_secret(OWNER, "s3cret")
    assert secret["data"] == {"token": "czNjcmV0"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    key = bootstrap_secret(OWNER, "k3y")
    assert key["metadata"]["name"] == "demo-bootstrap"
    assert key["data"] == {"token": "azN5"}
    assert key["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_router_gets_least_privilege_pod_read_rbac() -> None:
    objs = render_deployment(OWNER, parse_spec(example("minimal-cpu.yaml")))
    role = by_kind(objs, "Role")["demo-router"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    pod = by_kind(objs, "Deployment")["demo-router"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-router"


def test_the_generating_liveness_probe_and_sglang_detection_agree() -> None:
    """SGLang's /health generates one token through the scheduler on every probe (issue 25);
    pdwarden keeps that liveness probe (it restarts a hung scheduler) because detection reads
    progress only from series such a probe never moves (engines/sglang.py PROBE_MOVED)."""
    c = _sglang_pod({})["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"] for e in c["env"]}
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" not in env  # so the probe does generate
    for name, select in sglang.PROBE_MOVED:
        for series in sglang.METRICS.series:
            shared = select.keys() & series.select.keys()
            clash = any(select[k] != series.select[k] for k in shared)
            assert series.name != name or clash, (series, name, select)
