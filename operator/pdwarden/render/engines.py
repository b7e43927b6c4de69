"""Command lines per engine and role: pdworker's own flags, or stock SGLang's PD launch flags.

Why: the only difference between running pdworker and running SGLang is the container command,
its ports and a few environment variables; keeping them here lets every other render function
stay engine-agnostic, and lets tests check the SGLang flags against SGLang's documented ones.

A pdworker decode dials only its own deployment's prefill pods: it gets `--prefill-selector`
with the labels of those pods, lists them (in its namespace, $POD_NAMESPACE) with the
deployment's discovery ServiceAccount (the router's: pods get/list/watch, nothing else;
deployment.py gives it to decode pods) and refuses, before connecting, any bootstrap endpoint
that is not one of them at the port it declares as `bootstrap` (pdworker/allow.py). Pod IPs are
not known when a template is rendered, so a list rendered here could not name them; the
selector is what is known, and the decode enforces it.
"""

from __future__ import annotations

from typing import Any

from pdwarden.api import PDDeploymentSpec
from pdwarden.api.sglang import SGLangSpec, shm_size_for
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL
from pdwarden.render.common import (
    ADMIN_TOKEN_DIR,
    ADMIN_TOKEN_KEY,
    BOOTSTRAP_TOKEN_DIR,
    WORKER_PORT,
    Owner,
)
from pdwarden.render.launch import CACHE_DIR, SHM_DIR, Launch, Probes
from pdwarden.render.vllm import vllm_worker
from pdworker.contract import (
    ADMIN_TOKEN_FILE_ENV,
    BOOTSTRAP_TOKEN_FILE_ENV,
    FAULT_DECODE_STALL,
    FAULTS_ENV,
)

# sgl-router's Kubernetes discovery reads a prefill pod's bootstrap port from this annotation.
SGLANG_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"


# SGLang 0.5.23 entrypoints/http_server.py: /ready answers 200 once warm-up finished and the
# server is not paused, without running anything; /health runs a one-token generation when idle
# and gives up after SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s), so its probe timeout is above it.
# That generation is traffic: it runs even while the disaggregation queues are wedged and moves
# some counters (issue 25). Kept, since it is what restarts a hung scheduler, because detection
# reads progress only from series a probe never moves (remediation/scrape/engines.py
# PROBE_MOVED; tests/operator/test_render.py holds the two together). Turning it off
# (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false) would not be enough anyway: routers probe too.
SGLANG_READY_PATH = "/ready"
SGLANG_HEALTH_PATH = "/health"
SGLANG_HEALTH_TIMEOUT_SECONDS = 25
SGLANG_STARTUP_PERIOD_SECONDS = 10
# Where SGLang and its libraries write (srt/environ.py: SGLANG_CACHE_DIR and
# third_party_cache_defaults(), which puts Triton, Inductor, CUDA, TileLang and FlashInfer caches
# below it; huggingface_hub: HF_HOME). HOME covers anything that still writes under ~.
SGLANG_CACHE_ENV = {
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "SGLANG_CACHE_DIR": f"{CACHE_DIR}/sglang",
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "HOME": f"{CACHE_DIR}/home",
}


def role_selector(owner: Owner, role: str) -> str:
    """The label selector of one role's pods of one deployment."""
    return f"{LABEL_DEPLOYMENT}={owner.name},{LABEL_ROLE}={role}"


def worker_launch(owner: Owner, spec: PDDeploymentSpec, role: str) -> Launch:
    pool = spec.prefill if role == ROLE_PREFILL else spec.decode
    if spec.engine == "sglang":
        return _sglang_worker(spec, role, pool.gpus, pool.args)
    if spec.engine == "vllm":
        return vllm_worker(spec, role, pool.gpus, pool.args)
    # POD_IP, POD_NAME and POD_NAMESPACE reach pdworker as environment defaults (pods.py).
    command = ["pdworker", role, "--port", str(WORKER_PORT)]
    if role == ROLE_PREFILL:
        command += ["--bootstrap-port", str(spec.transfer.bootstrap_port)]
    else:  # the only prefills this decode may dial (module docstring)
        command += ["--prefill-selector", role_selector(owner, ROLE_PREFILL)]
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
    prefill, decode = role_selector(owner, ROLE_PREFILL), role_selector(owner, ROLE_DECODE)
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
            probes=Probes(health_path="/health", ready_path="/health"),
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
            *(["--engine", "vllm"] if spec.engine == "vllm" else []),
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
        env={"SGLANG_DISAGGREGATION_NIXL_BACKEND": spec.transfer.nixl_backend, **SGLANG_CACHE_ENV},
        annotations=annotations,
        probes=_sglang_probes(spec.sglang),
        volumes=_sglang_volumes(spec.sglang, gpus),
        mounts=({"name": "cache", "mountPath": CACHE_DIR}, {"name": "dshm", "mountPath": SHM_DIR}),
    )


def _sglang_probes(knobs: SGLangSpec) -> Probes:
    return Probes(
        health_path=SGLANG_HEALTH_PATH,
        ready_path=SGLANG_READY_PATH,
        health_timeout=SGLANG_HEALTH_TIMEOUT_SECONDS,
        health_period=30,
        startup_path=SGLANG_READY_PATH,
        startup_period=SGLANG_STARTUP_PERIOD_SECONDS,
        startup_failures=-(-knobs.startup_timeout_seconds // SGLANG_STARTUP_PERIOD_SECONDS),
    )


def _sglang_volumes(knobs: SGLangSpec, gpus: int) -> tuple[dict[str, Any], ...]:
    claim = knobs.cache.persistent_volume_claim
    cache: dict[str, Any] = (
        {"name": "cache", "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {"name": "cache", "emptyDir": {"sizeLimit": knobs.cache.size_limit}}
    )
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size_for(knobs, gpus)}}
    return (cache, shm)
