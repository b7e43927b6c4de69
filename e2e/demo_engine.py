"""What the real-engine demos share: one PDDeployment's pods, its ledger, and "serving again".

Why: `make demo ENGINE=vllm` and `ENGINE=sglang` tell the same kind of story (a stock pair
rendered by pdwarden, faults injected as signals to the pods' processes, pdwarden's repairs read
from the ledger, the pair serving through its router afterwards); only the engine's faults and
its request differ, and live in e2e/demo_vllm.py and e2e/demo_sglang.py.
"""

from __future__ import annotations

import time
from typing import Any

from e2e.demo_setup import NAMESPACE, Say, Setup
from e2e.pdtools import pods, status, wait_ready


class EngineStory:
    """A story about the PDDeployment `name`; subclasses tell it (`run`) and say how the router
    is asked for one answer (`routed_once`)."""

    engine = ""
    startup_seconds = 1200.0

    def __init__(self, setup: Setup, say: Say, name: str, acts: tuple[str, ...]) -> None:
        self.cluster, self.say, self.name = setup.cluster, say, name
        self.router = ""
        self.problems: list[str] = []
        self.ttr: dict[str, float | None] = dict.fromkeys(acts)

    def pod(self, role: str) -> dict[str, Any]:
        live = [p for p in pods(self.cluster, NAMESPACE, role, self.name)
                if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        assert len(live) == 1, f"{len(live)} {role} pods"
        return live[0]

    def ledger(self) -> list[dict[str, Any]]:
        st = status(self.cluster, NAMESPACE, self.name)
        return list((st.get("remediation") or {}).get("history", []))

    def entry(self, action: str, uid: str, timeout: float) -> dict[str, Any] | None:
        """The ledger's `action` on the pod `uid`, once it is there (None after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.ledger() if e["action"] == action and e.get("uid") == uid]
            if found:
                return found[0]
            time.sleep(1)
        return None

    def wait_pair_ready(self) -> None:
        wait_ready(self.cluster, NAMESPACE, {"prefill": "1/1", "decode": "1/1"},
                   self.startup_seconds, self.name)  # fmt: skip

    def routed_once(self) -> str | None:
        """One short answer through the router (None while it cannot route)."""
        raise NotImplementedError

    def whole_again(self, since: float) -> bool:
        """Both pods Ready and the router answering; says how long each took from `since`."""
        self.wait_pair_ready()
        ready = time.monotonic() - since
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                text = self.routed_once()
            except OSError:  # refused or timed out while the router has no pod to send it to
                text = None
            if text is not None:
                self.say(
                    f"the router answers again: {text!r} (both pods Ready {ready:.0f}s after "
                    f"the fault, routed {time.monotonic() - since:.0f}s after it)"
                )
                return True
            time.sleep(2)  # the router's discovery or health check has not admitted the pod yet
        return False

    def summary(self, operator: str) -> dict[str, Any]:
        ledger = [e for e in self.ledger() if not e.get("dryRun")]
        return {
            "deployment": f"{NAMESPACE}/{self.name}",
            "engine": self.engine,
            "operator": operator,
            "actions": [f"{e['action']} {e['pod']} ({e['outcome']})" for e in ledger],
            "time_to_recovery_s": {
                k: (round(v, 1) if v is not None else None) for k, v in self.ttr.items()
            },
            "recovered": not self.problems,
            "problems": self.problems,
        }
