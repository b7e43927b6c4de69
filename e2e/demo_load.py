"""The pdworker demo's traffic: bursts from `pdworker load` and steady load behind them.

Why apart: the scenario decides when to push and what to look at; how requests are sent (a
subprocess per burst, pdworker's load generator in-process for the steady stream) is the same
whatever the act.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PDWORKER = str(Path(sys.executable).parent / "pdworker")


def run_load(url: str, args: str) -> dict[str, Any]:
    """One `pdworker load ARGS` run against the router; its JSON summary (zeros if it broke)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "load.json"
        subprocess.run(
            [PDWORKER, "load", "--url", url, "--json", str(path), *args.split()],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if path.exists():
            summary: dict[str, Any] = json.loads(path.read_text())
            return summary
    return {"requests": 0, "completed": 0, "cancelled": 0, "timeouts": 0, "failed": {}}


class BackgroundLoad:
    """Steady traffic for the whole scenario: pdworker's load generator, in-process, in 5 s runs
    back to back (a new process per run would leave gaps in the served-requests curve)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.summaries: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-load", daemon=True)

    def _loop(self) -> None:
        from pdworker.load import LoadConfig
        from pdworker.load import run_load as load_run

        cfg = LoadConfig(
            self.url,
            clients=3,
            requests=None,
            duration=5,
            prompt_len=(4, 64),
            output_len=(1, 8),
            timeout=5,  # a client stuck on the stalled pod gives up; its next try is routed anew
        )
        while not self._stop.is_set():
            self.summaries.append(asyncio.run(load_run(cfg)))

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
