"""How the control plane's start waits for each part: polling with a deadline, plain HTTP.

Just enough of an API client to see the cluster come up (the default ServiceAccount, Ready
nodes); the tests use kubectl or the kubernetes client for everything else.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from e2e.cluster.processes import ClusterError


def wait_for(what: str, check: Callable[[], bool], timeout: float, proc_name: str = "") -> float:
    """Poll `check` until it is true; return the seconds it took or raise with the reason."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.25)
    hint = f"; see its log {proc_name}" if proc_name else ""
    raise ClusterError(f"{what} was not ready after {timeout:.0f}s{hint}")


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
        return bool(resp.status == 200)


@dataclass
class ApiClient:
    """Just enough of an API client to wait for the cluster; tests use kubectl or kubernetes."""

    server: str
    token: str
    ctx: ssl.SSLContext

    def get(self, path: str) -> dict[str, object] | None:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.ctx) as resp:
                data: dict[str, object] = json.loads(resp.read())
                return data
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def ready_nodes(self) -> int:
        nodes = self.get("/api/v1/nodes") or {}
        count = 0
        for node in nodes.get("items", []):  # type: ignore[attr-defined]
            for cond in node.get("status", {}).get("conditions", []):
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    count += 1
        return count
