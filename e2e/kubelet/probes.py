"""Readiness, liveness and startup probes: threshold bookkeeping (pure) and the three checks.

Why: readiness must come from the pod's own probes so EndpointSlices and the operator see the
same truth as on a real node; liveness failures restart the container like the real kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class ProbeSpec:
    kind: str  # readiness | liveness | startup
    spec: dict[str, Any]
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    @classmethod
    def parse(cls, kind: str, spec: dict[str, Any]) -> ProbeSpec:
        return cls(
            kind=kind,
            spec=spec,
            initial_delay=float(spec.get("initialDelaySeconds") or 0),
            period=float(spec.get("periodSeconds") or 10),
            timeout=float(spec.get("timeoutSeconds") or 1),
            # Liveness and startup probes must use 1 (API validation); readiness may not.
            success_threshold=int(spec.get("successThreshold") or 1),
            failure_threshold=int(spec.get("failureThreshold") or 3),
        )


@dataclass
class ProbeState:
    """Consecutive-result counting; `result` flips only when a threshold is reached."""

    spec: ProbeSpec
    result: bool = field(init=False)
    successes: int = 0
    failures: int = 0
    last_message: str = ""

    def __post_init__(self) -> None:
        # Readiness and startup start as failed; liveness starts as success.
        self.result = self.spec.kind == "liveness"

    def record(self, ok: bool, message: str = "") -> bool:
        """Record one probe outcome; return True when `result` changed."""
        self.last_message = message
        if ok:
            self.successes += 1
            self.failures = 0
            if not self.result and self.successes >= self.spec.success_threshold:
                self.result = True
                return True
        else:
            self.failures += 1
            self.successes = 0
            if self.result and self.failures >= self.spec.failure_threshold:
                self.result = False
                return True
        return False


def resolve_port(port: Any, ports: list[dict[str, Any]]) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in ports:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"named port {port!r} not found in the container's ports")


async def run_probe(
    spec: ProbeSpec,
    *,
    pod_ip: str,
    ports: list[dict[str, Any]],
    exec_argv: list[str] | None,
    env: dict[str, str],
    cwd: str,
) -> tuple[bool, str]:
    """Run one check; (ok, message). Never raises for probe failures."""
    s = spec.spec
    try:
        if "httpGet" in s:
            h = s["httpGet"]
            host = h.get("host") or pod_ip
            scheme = (h.get("scheme") or "HTTP").lower()
            port = resolve_port(h.get("port"), ports)
            path = h.get("path") or "/"
            headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
            timeout = aiohttp.ClientTimeout(total=spec.timeout)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(f"{scheme}://{host}:{port}{path}", headers=headers, ssl=False) as resp,
            ):
                ok = 200 <= resp.status < 400
                return ok, f"HTTP probe status {resp.status}"
        if "tcpSocket" in s:
            t = s["tcpSocket"]
            port = resolve_port(t.get("port"), ports)
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(t.get("host") or pod_ip, port), spec.timeout
            )
            writer.close()
            return True, "TCP connect ok"
        if "exec" in s:
            assert exec_argv is not None
            proc = await asyncio.create_subprocess_exec(
                *exec_argv,
                env=env,
                cwd=cwd,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), spec.timeout)
            except TimeoutError:
                _kill_group(proc.pid)
                await proc.wait()
                return False, f"exec probe timed out after {spec.timeout}s"
            text = out.decode(errors="replace").strip()[-300:]
            return proc.returncode == 0, f"exec probe exited with {proc.returncode}: {text}"
        if "grpc" in s:
            return False, "grpc probes are not supported by the local kubelet"
    except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as e:
        return False, f"{type(e).__name__}: {e}"
    return False, "probe has no handler"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, 9)
