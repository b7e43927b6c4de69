"""Turn a container spec into argv, env and cwd for a local process (mostly pure).

Why: Kubernetes' env rules (envFrom, then env in order, each value expanding earlier `$(VAR)`s;
command/args expanded with the full env; downward API and Secret/ConfigMap references) decide
what a program sees. Getting them right here is what makes one manifest work both on this local
kubelet and on a real cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .apiclient import Api
from .container import Launch
from .expand import expand, substitute_paths
from .images import resolve_argv
from .process import MARKER_ENV
from .volumes import ConfigError, field_value, get_keyed


def base_env(pod: dict[str, Any], pod_dir: Path, pass_env: list[str]) -> dict[str, str]:
    """What an image would provide: PATH, HOME, HOSTNAME; never the kubelet's own credentials."""
    from .images import VENV_BIN

    env = {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(pod_dir / "home"),
        "HOSTNAME": pod["metadata"]["name"],
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        MARKER_ENV: pod["metadata"]["uid"],
    }
    for name in pass_env:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def resource_value(
    container: dict[str, Any], ref: dict[str, Any], allocatable: dict[str, str]
) -> str:
    res = ref["resource"]  # e.g. limits.cpu, requests.memory
    kind, _, name = res.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    return str(value if value is not None else allocatable.get(name, "0"))


async def container_env(
    api: Api,
    pod: dict[str, Any],
    container: dict[str, Any],
    env: dict[str, str],
    allocatable: dict[str, str],
) -> dict[str, str]:
    ns = pod["metadata"]["namespace"]
    env = dict(env)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in src:
                data = await get_keyed(
                    api, kind, ns, src[key]["name"], bool(src[key].get("optional"))
                )
                for k, v in (data or {}).items():
                    env[prefix + k] = v.decode(errors="replace")
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        vf = var["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_value(container, vf["resourceFieldRef"], allocatable)
        else:
            kind = "Secret" if "secretKeyRef" in vf else "ConfigMap"
            ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef") or {}
            data = await get_keyed(api, kind, ns, ref["name"], bool(ref.get("optional")))
            if data is None:
                continue
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
            env[name] = data[ref["key"]].decode(errors="replace")
    return env


def build_launch(
    container: dict[str, Any],
    env: dict[str, str],
    mounts: dict[str, str],
    pod_dir: Path,
    kubectl: str | None,
    *,
    host_env: dict[str, str] | None = None,
) -> Launch:
    """argv/env/cwd with `$(VAR)` expanded and mountPaths replaced by host directories.

    `host_env` holds what the kubelet itself set (HOME, KUBECONFIG, ...): those values are host
    paths already and are never rewritten, even when they start with a mountPath such as /tmp.
    """
    own = host_env or {}
    env = {k: v if own.get(k) == v else substitute_paths(v, mounts) for k, v in env.items()}

    def fix(xs: list[str]) -> list[str]:
        return [substitute_paths(expand(x, env), mounts) for x in xs]

    argv = resolve_argv(
        container.get("image", ""),
        fix(container.get("command") or []),
        fix(container.get("args") or []),
        kubectl,
        env["PATH"],
    )
    cwd = container.get("workingDir")
    cwd = substitute_paths(cwd, mounts) if cwd else str(pod_dir)
    exec_probes = {}
    for kind in ("startup", "readiness", "liveness"):
        probe = container.get(f"{kind}Probe") or {}
        if "exec" in probe:
            cmd = fix(probe["exec"].get("command") or [])
            exec_probes[kind] = resolve_argv(
                container.get("image", ""), cmd, [], kubectl, env["PATH"]
            )
    return Launch(argv, env, cwd, exec_probes)
