"""Pod volumes materialised as directories in the pod's state dir.

Why: a process cannot mount anything, so each volume becomes a directory under
`<pod dir>/volumes/<name>` and the container's mountPaths are substituted (see expand.py).
Supported: secret, configMap, emptyDir, downwardAPI, projected (serviceAccountToken via the
TokenRequest API bound to the pod, configMap, secret, downwardAPI) and hostPath (the real host
path). Anything else becomes an empty directory with a warning.

Secret and ConfigMap contents are read again every SYNC_SECONDS while the pod lives, as a real
kubelet refreshes such volumes (not subPath mounts): a rotated Secret reaches a running
container, a file whose content is unchanged is left alone, and a Secret that is gone for a
moment (deleted to be recreated) leaves the last content in place.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from pathlib import Path
from typing import Any

from .apiclient import Api, ApiError

log = logging.getLogger("kubelet.volumes")

TOKEN_SECONDS = 3607
# A real kubelet refreshes within about a minute plus its cache's TTL; shorter here, so a test
# sees a rotated Secret in seconds.
SYNC_SECONDS = 5.0


class ConfigError(Exception):
    """A referenced Secret/ConfigMap is missing: the container waits with that reason."""


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Atomic write so a reader never sees half a token or config; unchanged content is left
    as it is (a reader watching the file sees a change only when there is one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def field_value(pod: dict[str, Any], field_path: str) -> str:
    """Downward API fieldRef values (what the real kubelet supports)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs") or []),
    }
    if field_path in simple:
        return str(simple[field_path])
    for kind in ("labels", "annotations"):
        values = meta.get(kind) or {}
        if field_path == f"metadata.{kind}":
            return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
        prefix = f"metadata.{kind}['"
        if field_path.startswith(prefix) and field_path.endswith("']"):
            return str(values.get(field_path[len(prefix) : -2], ""))
    raise ConfigError(f"unsupported fieldRef {field_path!r}")


async def get_keyed(
    api: Api, kind: str, ns: str, name: str, optional: bool
) -> dict[str, bytes] | None:
    """A Secret's or ConfigMap's data as bytes, or None when optional and missing."""
    plural = "secrets" if kind == "Secret" else "configmaps"
    obj = await api.get_or_none(f"/api/v1/namespaces/{ns}/{plural}/{name}")
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    out: dict[str, bytes] = {}
    for k, v in (obj.get("data") or {}).items():
        out[k] = base64.b64decode(v) if kind == "Secret" else str(v).encode()
    for k, v in (obj.get("binaryData") or {}).items():
        out[k] = base64.b64decode(v)
    return out


async def request_token(
    api: Api, pod: dict[str, Any], audience: str | None, seconds: int
) -> tuple[str, float]:
    """A TokenRequest bound to the pod; returns (token, unix time to refresh at)."""
    meta = pod["metadata"]
    sa = pod["spec"].get("serviceAccountName") or "default"
    spec: dict[str, Any] = {
        "expirationSeconds": seconds,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    if audience:
        spec["audiences"] = [audience]
    resp = await api.request(
        "POST",
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    # Refresh at 80% of the lifetime, like the kubelet's token manager.
    return resp["status"]["token"], time.time() + 0.8 * seconds


def _keyed(vol: dict[str, Any]) -> bool:
    """Whether a volume holds a Secret's or a ConfigMap's content (refreshed while it lives)."""
    sources = (vol.get("projected") or {}).get("sources") or []
    return (
        "secret" in vol
        or "configMap" in vol
        or any("secret" in src or "configMap" in src for src in sources)
    )


def _items(data: dict[str, bytes], items: list[dict[str, Any]] | None) -> dict[str, bytes]:
    if not items:
        return data
    out = {}
    for it in items:
        if it["key"] in data:
            out[it.get("path") or it["key"]] = data[it["key"]]
        else:
            raise ConfigError(f"key {it['key']!r} not found")
    return out


class VolumeSet:
    """All volumes of one pod; `materialise` is idempotent and refreshes tokens when due."""

    def __init__(self, pod: dict[str, Any], root: Path) -> None:
        self.root = root
        self.host_paths: dict[str, str] = {}
        self.refresh_at = float("inf")
        self.pod = pod
        # Bound ServiceAccount tokens by volume/path, with when each is due: a refresh for a
        # Secret's sake asks for a new token only when the old one is due.
        self.tokens: dict[str, tuple[bytes, float]] = {}

    async def materialise(self, api: Api) -> None:
        self.refresh_at = float("inf")
        ns = self.pod["metadata"]["namespace"]
        for vol in self.pod["spec"].get("volumes") or []:
            name = vol["name"]
            d = self.root / name
            if "hostPath" in vol:
                self.host_paths[name] = vol["hostPath"]["path"]
                continue
            d.mkdir(parents=True, exist_ok=True)
            self.host_paths[name] = str(d)
            files: dict[str, bytes] = {}
            if "secret" in vol or "configMap" in vol:
                kind = "Secret" if "secret" in vol else "ConfigMap"
                src = vol["secret"] if kind == "Secret" else vol["configMap"]
                ref = src.get("secretName") or src.get("name")
                data = await get_keyed(api, kind, ns, ref, bool(src.get("optional")))
                files = _items(data or {}, src.get("items"))
            elif "downwardAPI" in vol:
                files = self._downward(vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                sources = vol["projected"].get("sources") or []
                files = await self._projected(api, ns, name, sources)
            elif "emptyDir" not in vol:
                log.warning("volume %s: unsupported type, using an empty directory", name)
            for rel, content in files.items():
                write_file(d / rel, content, 0o600 if "secret" in vol else 0o644)
            if _keyed(vol):
                self.refresh_at = min(self.refresh_at, time.time() + SYNC_SECONDS)

    async def refresh(self, api: Api) -> None:
        """`materialise` again when due (tokens, Secrets, ConfigMaps); what cannot be read now
        keeps its last content and is tried again later, as a real kubelet does."""
        try:
            await self.materialise(api)
        except (ConfigError, ApiError, OSError) as e:
            log.warning("pod %s: volumes not refreshed (%s); kept as they were",
                        self.pod["metadata"].get("name"), e)  # fmt: skip
            self.refresh_at = time.time() + SYNC_SECONDS

    def _downward(self, items: list[dict[str, Any]]) -> dict[str, bytes]:
        out = {}
        for it in items:
            if "fieldRef" in it:
                out[it["path"]] = field_value(self.pod, it["fieldRef"]["fieldPath"]).encode()
        return out

    async def _projected(
        self, api: Api, ns: str, volume: str, sources: list[dict[str, Any]]
    ) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for src in sources:
            if "serviceAccountToken" in src:
                t = src["serviceAccountToken"]
                path = t.get("path") or "token"
                held = self.tokens.get(f"{volume}/{path}")
                if held is None or time.time() >= held[1]:
                    try:
                        token, refresh = await request_token(
                            api,
                            self.pod,
                            t.get("audience"),
                            int(t.get("expirationSeconds") or TOKEN_SECONDS),
                        )
                    except ApiError as e:
                        raise ConfigError(f"TokenRequest failed: {e}") from e
                    held = self.tokens[f"{volume}/{path}"] = (token.encode(), refresh)
                self.refresh_at = min(self.refresh_at, held[1])
                out[path] = held[0]
            elif "configMap" in src or "secret" in src:
                kind = "Secret" if "secret" in src else "ConfigMap"
                s = src["secret"] if kind == "Secret" else src["configMap"]
                data = await get_keyed(api, kind, ns, s["name"], bool(s.get("optional")))
                out.update(_items(data or {}, s.get("items")))
            elif "downwardAPI" in src:
                out.update(self._downward(src["downwardAPI"].get("items") or []))
        return out

    def mounts(self, container: dict[str, Any]) -> dict[str, str]:
        """container mountPath -> host path, for path substitution."""
        out = {}
        for m in container.get("volumeMounts") or []:
            host = self.host_paths.get(m["name"])
            if host is None:
                continue
            if m.get("subPath"):
                host = os.path.join(host, m["subPath"])
            out[m["mountPath"]] = host
        return out

    def token_file(self) -> str | None:
        """The automounted ServiceAccount token (kube-api-access-* projected volume), if any."""
        for vol in self.pod["spec"].get("volumes") or []:
            for src in (vol.get("projected") or {}).get("sources") or []:
                if "serviceAccountToken" in src and not src["serviceAccountToken"].get("audience"):
                    path = src["serviceAccountToken"].get("path") or "token"
                    return os.path.join(self.host_paths[vol["name"]], path)
        return None
