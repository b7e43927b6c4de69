"""The pod template every role shares: container, probes, env, volumes and hardening.

Why: prefill, decode and router pods differ only in their command, GPU count and a readiness
gate; building the template in one place keeps security settings and the admin-token mount
identical everywhere.
"""

from __future__ import annotations

from typing import Any

from pdwarden.api import PDDeploymentSpec
from pdwarden.api.pools import GPU_RESOURCE, PodSettings
from pdwarden.constants import (
    ADMIN_TOKEN_DIR,
    BOOTSTRAP_TOKEN_DIR,
    CONDITION_SERVING,
    ROLE_DECODE,
    WORKER_PORT,
)
from pdwarden.engines.launch import Launch
from pdwarden.render.common import (
    DEFAULT_PDWORKER_IMAGE,
    Obj,
    Owner,
    object_labels,
)

RUN_AS_USER = 10001
DOWNWARD_ENV = {
    "POD_IP": "status.podIP",
    "POD_NAME": "metadata.name",
    "POD_NAMESPACE": "metadata.namespace",
    "POD_UID": "metadata.uid",
}


def image_of(spec: PDDeploymentSpec) -> str:
    return spec.image or DEFAULT_PDWORKER_IMAGE


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


def _env(launch: Launch, settings: PodSettings) -> list[Obj]:
    env: list[Obj] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in DOWNWARD_ENV.items()
    ]
    env += [{"name": k, "value": v} for k, v in sorted(launch.env.items())]
    user = [_dump(e) for e in settings.env]
    overridden = {e["name"] for e in user}
    return [e for e in env if e["name"] not in overridden] + user


def _resources(settings: PodSettings, gpus: int) -> Obj:
    resources: Obj = _dump(settings.resources) if settings.resources else {}
    if gpus:
        for key in ("requests", "limits"):
            resources.setdefault(key, {})[GPU_RESOURCE] = gpus
    return resources


def _probe(path: str, period: int, failures: int, timeout: int = 2) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def pod_template(
    owner: Owner,
    spec: PDDeploymentSpec,
    role: str,
    *,
    settings: PodSettings,
    launch: Launch,
    gpus: int,
    admin_secret: str | None,
    service_account: str | None = None,
    bootstrap_secret: str | None = None,
) -> Obj:
    """The pod template of one role. `admin_secret` mounts the worker admin token when given,
    `bootstrap_secret` the deployment's KV-handshake key."""
    probes = launch.probes
    container: Obj = {
        "name": role,
        "image": image_of(spec),
        "command": launch.command,
        "env": _env(launch, settings),
        "ports": [{"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"}],
        "readinessProbe": _probe(probes.ready_path, period=2, failures=2),
        "livenessProbe": _probe(
            probes.health_path,
            period=probes.health_period,
            failures=3,
            timeout=probes.health_timeout,
        ),
        "startupProbe": _probe(
            probes.startup_path or probes.health_path,
            period=probes.startup_period,
            failures=probes.startup_failures,
        ),
        "resources": _resources(settings, gpus),
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *launch.mounts],
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    if spec.transfer.bootstrap_port and role != "router":
        container["ports"].append(
            {"name": "bootstrap", "containerPort": spec.transfer.bootstrap_port, "protocol": "TCP"}
        )
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}, *launch.volumes]
    if admin_secret:
        volumes.append(
            {"name": "admin-token", "secret": {"secretName": admin_secret, "defaultMode": 0o440}}
        )
        container["volumeMounts"].append(
            {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True}
        )
    if bootstrap_secret:
        volumes.append(
            {
                "name": "bootstrap-token",
                "secret": {"secretName": bootstrap_secret, "defaultMode": 0o440},
            }
        )
        container["volumeMounts"].append(
            {"name": "bootstrap-token", "mountPath": BOOTSTRAP_TOKEN_DIR, "readOnly": True}
        )
    pod_spec: Obj = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        "automountServiceAccountToken": service_account is not None,
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if role == ROLE_DECODE:
        pod_spec["readinessGates"] = [{"conditionType": CONDITION_SERVING}]
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = [_dump(t) for t in settings.tolerations]
    if settings.affinity:
        pod_spec["affinity"] = settings.affinity
    if settings.priority_class_name:
        pod_spec["priorityClassName"] = settings.priority_class_name
    return {
        "metadata": {
            "labels": {**settings.labels, **object_labels(owner, role)},
            "annotations": {**settings.annotations, **launch.annotations},
        },
        "spec": pod_spec,
    }
