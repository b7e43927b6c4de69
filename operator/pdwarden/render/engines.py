"""Command lines per engine and role: pdworker's own flags, or stock SGLang's PD launch flags.

Why: the only difference between running pdworker and running SGLang is the container command,
its ports and a few environment variables; keeping them here lets every other render function
stay engine-agnostic, and lets tests check the SGLang flags against SGLang's documented ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdwarden.api import PDDeploymentSpec
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL
from pdwarden.render.common import (
    ADMIN_TOKEN_DIR,
    ADMIN_TOKEN_KEY,
    BOOTSTRAP_TOKEN_DIR,
    WORKER_PORT,
    Owner,
)
from pdworker.contract import (
    ADMIN_TOKEN_FILE_ENV,
    BOOTSTRAP_TOKEN_FILE_ENV,
    FAULT_DECODE_STALL,
    FAULTS_ENV,
)

# sgl-router's Kubernetes discovery reads a prefill pod's bootstrap port from this annotation.
SGLANG_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"


@dataclass(frozen=True)
class Launch:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    health_path: str = "/healthz"
    ready_path: str = "/readyz"


def worker_launch(spec: PDDeploymentSpec, role: str) -> Launch:
    pool = spec.prefill if role == ROLE_PREFILL else spec.decode
    if spec.engine == "sglang":
        return _sglang_worker(spec, role, pool.gpus, pool.args)
    # POD_IP, POD_NAME and POD_NAMESPACE reach pdworker as environment defaults (pods.py).
    command = ["pdworker", role, "--port", str(WORKER_PORT)]
    if role == ROLE_PREFILL:
        command += ["--bootstrap-port", str(spec.transfer.bootstrap_port)]
    env = {BOOTSTRAP_TOKEN_FILE_ENV: f"{BOOTSTRAP_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"}
    if needs_admin_token(spec, role):
        env[ADMIN_TOKEN_FILE_ENV] = f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"
    return Launch(command=[*command, *pool.args], env=env)


def needs_admin_token(spec: PDDeploymentSpec, role: str) -> bool:
    """Only what a role uses: the operator calls prefill's admin API; decode's is used only to
    trigger the decode-stall fault on purpose, so only a decode with that fault armed gets it."""
    if role == ROLE_PREFILL:
        return True
    if role != ROLE_DECODE or spec.engine != "pdworker":
        return False
    faults = [e.value or "" for e in spec.decode.env if e.name == FAULTS_ENV]
    return any(FAULT_DECODE_STALL in text for text in [*faults, *spec.decode.args])


def router_launch(spec: PDDeploymentSpec, owner: Owner) -> Launch:
    prefill = f"{LABEL_DEPLOYMENT}={owner.name},{LABEL_ROLE}={ROLE_PREFILL}"
    decode = f"{LABEL_DEPLOYMENT}={owner.name},{LABEL_ROLE}={ROLE_DECODE}"
    if spec.engine == "sglang":
        return Launch(
            command=[
                "python3",
                "-m",
                "sglang_router.launch_router",
                "--pd-disaggregation",
                "--host",
                "0.0.0.0",
                "--port",
                str(WORKER_PORT),
                "--service-discovery",
                "--service-discovery-namespace",
                owner.namespace,
                "--prefill-selector",
                prefill.replace(",", " "),
                "--decode-selector",
                decode.replace(",", " "),
                "--service-discovery-port",
                str(WORKER_PORT),
                *spec.router.args,
            ],
            health_path="/health",
            ready_path="/health",
        )
    return Launch(
        command=[
            "pdworker",
            "router",
            "--host",
            "$(POD_IP)",
            "--port",
            str(WORKER_PORT),
            "--discovery",
            "kubernetes",
            "--namespace",
            owner.namespace,
            "--prefill-selector",
            prefill,
            "--decode-selector",
            decode,
            *spec.router.args,
        ],
    )


def _sglang_worker(spec: PDDeploymentSpec, role: str, gpus: int, args: list[str]) -> Launch:
    model = spec.model
    command = [
        "python3", "-m", "sglang.launch_server",
        "--model-path", model.name,
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-bootstrap-port", str(spec.transfer.bootstrap_port),
        "--host", "0.0.0.0",
        "--port", str(WORKER_PORT),
        "--tp-size", str(max(gpus, 1)),
        "--enable-metrics",
    ]  # fmt: skip
    if model.served_name:
        command += ["--served-model-name", model.served_name]
    annotations = (
        {SGLANG_BOOTSTRAP_ANNOTATION: str(spec.transfer.bootstrap_port)}
        if role == ROLE_PREFILL
        else {}
    )
    return Launch(
        command=[*command, *args],
        env={"SGLANG_DISAGGREGATION_NIXL_BACKEND": spec.transfer.nixl_backend},
        annotations=annotations,
        health_path="/health",
        ready_path="/health",
    )
