"""One JSON-over-HTTP helper for tests, benchmarks and the demo (worker and router endpoints).

Why: tests, bench/ and the demo all talk to pdworker's HTTP API the same way; a single helper
keeps status handling (HTTPError bodies, non-JSON answers) identical everywhere.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: bytes | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """(status, parsed JSON or text). `raw` sends bytes as they are (for bad-body tests)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
