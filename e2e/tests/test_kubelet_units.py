"""Pure parts of the local kubelet: expansion, paths, pod IPs, images, status, probes, volumes."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e import vllm
from e2e.kubelet import images, memcg, podips
from e2e.kubelet.expand import expand, substitute_paths
from e2e.kubelet.probes import ProbeSpec, ProbeState
from e2e.kubelet.status import ContainerView, conditions, overwritten, phase
from e2e.kubelet.volumes import SYNC_SECONDS, VolumeSet, field_value

from pdwarden.constants import CONDITION_SERVING


@pytest.mark.parametrize(
    ("quantity", "want"),
    [("512Mi", 512 << 20), ("1Gi", 1 << 30), ("134217728", 134217728), ("1G", 10**9),
     ("1.5Gi", 3 << 29), ("128k", 128000), ("1e3", 1000)],
)  # fmt: skip
def test_memory_quantities_are_read_as_kubernetes_writes_them(quantity: str, want: int) -> None:
    assert memcg.quantity_bytes(quantity) == want
    assert memcg.memory_limit({"resources": {"limits": {"memory": quantity}}}) == want


def test_a_container_without_a_readable_memory_limit_has_none() -> None:
    assert memcg.memory_limit({"name": "c"}) is None
    assert memcg.memory_limit({"resources": {"requests": {"memory": "1Gi"}}}) is None
    assert memcg.memory_limit({"resources": {"limits": {"memory": "lots"}}}) is None
    with pytest.raises(ValueError, match="not a memory quantity"):
        memcg.quantity_bytes("12 Mi")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("--bind $(POD_IP)", "--bind 10.244.1.2"),
        ("$(UNDEFINED) stays", "$(UNDEFINED) stays"),
        ("$$(POD_IP) escaped", "$(POD_IP) escaped"),
        ("a$b $ $(", "a$b $ $("),
        ("$(POD_IP):$(PORT)", "10.244.1.2:8080"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, want: str) -> None:
    assert expand(text, {"POD_IP": "10.244.1.2", "PORT": "8080"}) == want


def test_mount_paths_are_replaced_only_as_path_prefixes() -> None:
    mounts = {"/etc/config": "/state/v/config", "/etc/config/extra": "/state/v/extra"}
    assert (
        substitute_paths("--config=/etc/config/a.yaml", mounts) == "--config=/state/v/config/a.yaml"
    )
    assert substitute_paths("/etc/config", mounts) == "/state/v/config"
    assert substitute_paths("/etc/config/extra/x", mounts) == "/state/v/extra/x"
    assert substitute_paths("/etc/configuration", mounts) == "/etc/configuration"
    assert substitute_paths("/opt/etc/config", mounts) == "/opt/etc/config"


def test_pod_cidr_maps_into_loopback_or_stays_real() -> None:
    assert str(podips.map_cidr("10.244.3.0/24", "loopback")) == "127.244.3.0/24"
    assert str(podips.map_cidr("10.231.17.0/24", "local-route")) == "10.231.17.0/24"


def test_allocator_gives_distinct_addresses_and_reuses_freed_ones_last() -> None:
    alloc = podips.IpAllocator(ipaddress.IPv4Network("127.244.3.0/29"))  # hosts .2-.6
    a, b = alloc.allocate("a"), alloc.allocate("b")
    assert (a, b) == ("127.244.3.2", "127.244.3.3")
    assert alloc.allocate("a") == a  # idempotent per UID
    alloc.release("a")
    assert alloc.allocate("c") == "127.244.3.4"  # a recreated pod gets a new address
    assert alloc.allocate("d", preferred="127.244.3.2") == "127.244.3.2"
    alloc.allocate("e")
    alloc.allocate("f")
    with pytest.raises(RuntimeError, match="full"):
        alloc.allocate("g")


@pytest.mark.parametrize(
    ("image", "kind"),
    [
        ("ghcr.io/acme/pdworker:1.2", "venv"),
        ("pdwarden@sha256:abc", "venv"),
        ("python:3.11", "venv"),
        ("registry.k8s.io/kubectl:v1.35.4", "kubectl"),
        ("busybox", "host"),
    ],
)
def test_image_table(image: str, kind: str) -> None:
    assert images.runner_for(image).kind == kind


def test_unknown_image_is_refused_with_advice() -> None:
    with pytest.raises(images.ImageNotMapped, match="pdworker"):
        images.runner_for("nginx:1.27")


def test_vllm_image_runs_the_stock_vllm_venv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`vllm/vllm-openai` runs the real vLLM of the cached venv: its entrypoint `vllm serve`,
    `python3 -m vllm...` with that venv's interpreter; an unbuilt venv is a clear start error."""
    monkeypatch.setenv("PDWARDEN_CACHE", str(tmp_path))
    image = "docker.io/vllm/vllm-openai:v0.32.0"
    assert images.runner_for(image).kind == "vllm"
    with pytest.raises(FileNotFoundError, match="make vllm-venv"):
        images.resolve_argv(image, [], ["--port", "9"], None, "")
    venv = vllm.venv_dir()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    (venv / "bin" / "vllm").chmod(0o755)
    (venv / ".pdwarden-complete").write_text("")
    assert images.resolve_argv(image, [], ["m", "--port", "9"], None, "") == [
        str(venv / "bin" / "vllm"), "serve", "m", "--port", "9",
    ]  # fmt: skip
    argv = images.resolve_argv(image, ["python3", "-m", "vllm.entrypoints.cli.main"], [], None, "")
    assert argv == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.cli.main"]


def test_python_runs_the_venv_interpreter_and_command_replaces_entrypoint() -> None:
    argv = images.resolve_argv("python:3.11", ["python3", "-m", "http.server"], ["8080"], None, "")
    assert argv == [sys.executable, "-m", "http.server", "8080"]
    argv = images.resolve_argv("python:3.11", [], ["-c", "pass"], None, "")
    assert argv == [sys.executable, "-c", "pass"]


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
    "spec": {
        "nodeName": "gpu-node-0",
        "readinessGates": [{"conditionType": CONDITION_SERVING}],
    },
    "status": {"podIP": "10.244.0.2", "hostIP": "127.0.0.1", "conditions": []},
}


def test_downward_api_fields() -> None:
    assert field_value(POD, "status.podIP") == "10.244.0.2"
    assert field_value(POD, "spec.nodeName") == "gpu-node-0"
    assert field_value(POD, "metadata.labels['app']") == "x"


def running(ready: bool = True) -> ContainerView:
    return ContainerView("c", "python", {"running": {}}, ready=ready, started=True)


def exited(code: int) -> ContainerView:
    return ContainerView("c", "python", {"terminated": {"exitCode": code}})


def test_phase_follows_restart_policy() -> None:
    waiting = ContainerView("c", "python", {"waiting": {"reason": "ContainerCreating"}})
    assert phase("Always", [waiting], True) == "Pending"
    assert phase("Always", [running()], False) == "Pending"
    assert phase("Always", [running()], True) == "Running"
    assert phase("Never", [exited(0)], True) == "Succeeded"
    assert phase("Never", [exited(1)], True) == "Failed"
    assert phase("OnFailure", [exited(1)], True) == "Running"
    assert phase("Always", [exited(0)], True) == "Running"
    crashloop = ContainerView(
        "c", "python", {"waiting": {"reason": "CrashLoopBackOff"}}, restart_count=2
    )
    assert phase("Always", [crashloop], True) == "Running"


def conds(pod: dict[str, Any], views: list[ContainerView]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions(pod, views, True, "T1")}


def test_ready_needs_containers_and_every_readiness_gate() -> None:
    c = conds(POD, [running()])
    assert c["ContainersReady"]["status"] == "True"
    assert c["Ready"]["status"] == "False"
    assert c["Ready"]["reason"] == "ReadinessGatesNotReady"
    gate_true = {
        **POD,
        "status": {"conditions": [{"type": CONDITION_SERVING, "status": "True"}]},
    }
    assert conds(gate_true, [running()])["Ready"]["status"] == "True"
    assert conds(gate_true, [running(ready=False)])["Ready"]["status"] == "False"


def test_transition_time_kept_while_status_unchanged() -> None:
    prev = {"type": "ContainersReady", "status": "True", "lastTransitionTime": "T0"}
    pod = {**POD, "status": {"conditions": [prev]}}
    assert conds(pod, [running()])["ContainersReady"]["lastTransitionTime"] == "T0"
    assert conds(pod, [running(ready=False)])["ContainersReady"]["lastTransitionTime"] == "T1"


def test_probe_thresholds() -> None:
    ready = ProbeState(ProbeSpec.parse("readiness", {"successThreshold": 2, "failureThreshold": 2}))
    assert ready.result is False
    assert not ready.record(True) and ready.result is False
    assert ready.record(True) and ready.result is True
    assert not ready.record(False) and ready.result is True
    assert ready.record(False) and ready.result is False
    live = ProbeState(ProbeSpec.parse("liveness", {"failureThreshold": 3}))
    assert live.result is True
    assert not live.record(False) and not live.record(False)
    assert live.record(False) and live.result is False


def test_kubelet_owned_env_is_never_rewritten_even_under_a_mount_path(tmp_path: Any) -> None:
    from e2e.kubelet.launch import build_launch

    container = {"image": "python:3.11", "command": ["python", "-c", "pass"]}
    mounts = {"/tmp": str(tmp_path / "vol-tmp")}
    own = {"PATH": "/usr/bin", "KUBECONFIG": "/tmp/state/pod/kubeconfig"}
    env = {**own, "CACHE": "/tmp/cache"}
    launch = build_launch(container, env, mounts, tmp_path, None, host_env=own)
    assert launch.env["KUBECONFIG"] == "/tmp/state/pod/kubeconfig"
    assert launch.env["CACHE"] == f"{tmp_path}/vol-tmp/cache"


def test_a_replacement_is_never_rewritten_by_a_shorter_mount_path() -> None:
    mounts = {
        "/var/run/admin": "/tmp/state/pod/volumes/admin",
        "/tmp": "/tmp/state/pod/volumes/tmp",
    }
    assert substitute_paths("/var/run/admin/token", mounts) == "/tmp/state/pod/volumes/admin/token"
    assert substitute_paths("/tmp/x", mounts) == "/tmp/state/pod/volumes/tmp/x"


class SecretsApi:
    """The one call VolumeSet makes for a Secret volume, over a dict (None: the Secret is gone)."""

    def __init__(self) -> None:
        self.data: dict[str, str] | None = {"token": "first"}
        self.gets = 0

    async def get_or_none(self, path: str) -> Any:
        self.gets += 1
        assert path == "/api/v1/namespaces/ns/secrets/pd-admin", path
        if self.data is None:
            return None
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.data.items()}}


def test_a_secret_volume_follows_its_secret_and_keeps_its_content_while_it_is_gone(
    tmp_path: Path,
) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"volumes": [{"name": "admin", "secret": {"secretName": "pd-admin"}}]},
    }
    api, volumes = SecretsApi(), VolumeSet(pod, tmp_path)
    token = tmp_path / "admin" / "token"
    asyncio.run(volumes.materialise(api))  # type: ignore[arg-type]
    assert token.read_text() == "first"
    assert volumes.refresh_at <= time.time() + SYNC_SECONDS  # refreshed while the pod lives
    inode = token.stat().st_ino
    asyncio.run(volumes.refresh(api))  # type: ignore[arg-type]
    assert token.stat().st_ino == inode  # unchanged content is not rewritten
    api.data = {"token": "second"}
    asyncio.run(volumes.refresh(api))  # type: ignore[arg-type]
    assert token.read_text() == "second" and token.stat().st_ino != inode  # swapped in whole
    api.data = None  # deleted, to be recreated
    asyncio.run(volumes.refresh(api))  # type: ignore[arg-type]
    assert token.read_text() == "second"
    assert volumes.refresh_at <= time.time() + SYNC_SECONDS  # tried again later
    assert api.gets == 4


def test_a_condition_someone_else_overwrote_is_written_back() -> None:
    """The node lifecycle controller marked the pod Ready False while this kubelet was away: its
    own view differs from the API's, so it reports again (a gate someone else owns is theirs)."""
    mine = {"conditions": [{"type": "Ready", "status": "True"},
                           {"type": "ContainersReady", "status": "True"}]}  # fmt: skip
    held = {"status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "ContainersReady", "status": "True"},
                                      {"type": CONDITION_SERVING, "status": "False"}]}}  # fmt: skip
    assert not overwritten(held, mine)
    held["status"]["conditions"][0]["status"] = "False"
    assert overwritten(held, mine)
