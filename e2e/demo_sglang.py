"""`make demo ENGINE=sglang`: real SGLang pods freeze for real, pdwarden repairs them.

The story, narrated like the vLLM one: a stock SGLang 0.5.23 prefill/decode pair (the CPU venv of
e2e/sglang, the tiny model of the vLLM tier, KV written by NIXL) rendered by pdwarden from a
PDDeployment with `engine: sglang`, the stock `sglang-router` in PD mode finding the pods through
the Kubernetes API, remediation Enforce at pdwarden's defaults. Two faults, injected from outside
as signals (never a patched SGLang), each while requests arrive through the router:

1. the prefill's scheduler freezes: its HTTP server still accepts requests, every gauge of both
   pods stays at its last snapshot (the decode's shows requests running); pdwarden's pair canary
   asks both pods' own /health, hears the decode and not the prefill, and restarts the prefill;
2. the decode's scheduler freezes likewise: the canary hears the prefill and not the decode, so
   the decode is cordoned, then restarted, and the stock router admits the new pod.

It needs the local cluster's kubelet (signals go to the pod's processes on this machine), so it
refuses a KUBECONFIG cluster. Exit status 0 only if both were repaired and the pair serves again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from e2e.demo_engine import EngineStory
from e2e.demo_setup import NAMESPACE, Setup
from e2e.httpjson import http
from e2e.pdtools import apply, router_url
from e2e.sglang import cache_root, ensure_venv
from e2e.sglang.client import pd_generate, url
from e2e.sglang.faults import freeze_scheduler
from e2e.sglang.pods import STARTUP_SECONDS, pd_deployment
from e2e.vllm.faults import thaw
from e2e.vllm.tinymodel import ensure_model
from pdwarden.api import RemediationSpec

NAME = "demo-sglang"
# Every action SGLang allows (RestartPrefill is opt-in), everything else at pdwarden's defaults.
ACTIONS = ["AbortRequests", "RestartPrefill", "CordonDecode", "RestartDecode"]
DEFAULTS = RemediationSpec()
HEALTH_WAIT = 8.0  # how long the story asks the frozen pod's /health itself


def _generate(text: str, tokens: int) -> dict[str, object]:
    return {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}


class _Traffic:
    """Two clients asking the router in a loop until stopped (what the frozen pod strands)."""

    def __init__(self, router: str) -> None:
        self.router, self.answered = router, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                code, _ = http("POST", self.router + "/generate", _generate("a request", 8),
                               timeout=60)  # fmt: skip
            except OSError:  # stranded by the frozen pod, or refused while it restarts
                code = 0
            self.answered += code == 200
            if code != 200:
                self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(70)


class SGLangStory(EngineStory):
    engine, startup_seconds = "sglang", STARTUP_SECONDS

    def __init__(self, setup: Setup, say: Callable[[str], None]) -> None:
        super().__init__(setup, say, NAME, ("frozen_prefill", "frozen_decode"))

    def routed_once(self) -> str | None:
        code, answer = http("POST", self.router + "/generate", _generate("serve again", 4),
                            timeout=120)  # fmt: skip
        return str(answer["text"]) if code == 200 and isinstance(answer, dict) else None

    def run(self) -> None:
        self.say("building (or reusing) stock SGLang for CPU and the tiny test model ...")
        venv = ensure_venv()
        model = ensure_model(venv, cache_root())
        apply(self.cluster, NAMESPACE,
              pd_deployment(str(model), NAME, mode="Enforce", actions=ACTIONS))  # fmt: skip
        self.say(
            f"applied PDDeployment {NAME} (engine: sglang): 1 prefill + 1 decode "
            f"`sglang.launch_server` (0.5.23 on CPU, NIXL), the stock sglang-router in PD mode; "
            f"remediation Enforce at the defaults (scrape {DEFAULTS.scrape_interval_seconds}s, "
            f"wedgeAfter {DEFAULTS.wedge_after_seconds}s, restartAfter "
            f"{DEFAULTS.restart_after_seconds}s)"
        )
        self.say("waiting for both SGLang servers (each imports torch and SGLang: a minute or so)")
        t0 = time.monotonic()
        self.wait_pair_ready()
        self.router = router_url(self.cluster, NAMESPACE, NAME)
        self.say(f"both Ready in {time.monotonic() - t0:.0f}s")
        prefill_ip, decode_ip = (self.pod(r)["status"]["podIP"] for r in ("prefill", "decode"))
        answer = pd_generate(prefill_ip, decode_ip, "the prefill of a cache and decode", 8)
        self.say(
            f"a PD request: the decode asked the prefill's bootstrap server for the room, the "
            f"prefill wrote its KV into the decode's pool over NIXL, and the decode generated "
            f"{answer['text']!r}"
        )
        self.frozen("prefill", "RestartPrefill")
        self.frozen("decode", "CordonDecode", "RestartDecode")

    def frozen(self, role: str, *actions: str) -> None:
        """Freeze `role`'s scheduler under traffic; wait for `actions` on it, in order."""
        pod = self.pod(role)
        uid, ip, name = pod["metadata"]["uid"], pod["status"]["podIP"], pod["metadata"]["name"]
        act = "ACT 1" if role == "prefill" else "ACT 2"
        self.say(
            f"{act}, the {role}'s scheduler freezes (SIGSTOP of sglang::scheduler) while "
            f"requests arrive through the router; its HTTP server still accepts them"
        )
        traffic = _Traffic(self.router)
        frozen, start = freeze_scheduler(uid), time.monotonic()
        try:
            try:
                code, _ = http("GET", url(ip, "/health"), timeout=HEALTH_WAIT)
                told = f"answers {code}"
            except OSError:  # a timeout included: the scheduler never answers it
                told = f"gives no answer within {HEALTH_WAIT:g}s"
            self.say(
                f"{name}'s /health {told} (SGLang itself says 503 only after 20 s without its "
                f"scheduler); every gauge of both pods keeps its last snapshot"
            )
            for action in actions:
                entry = self.entry(action, uid, DEFAULTS.wedge_after_seconds + 240)
                if entry is None:
                    self.problems.append(f"the frozen {role} got no {action}")
                    return
                self.say(
                    f"pdwarden, {time.monotonic() - start:.0f}s after the freeze: {action} "
                    f"{entry['pod']}: {entry['reason']}"
                )
            self.ttr[f"frozen_{role}"] = time.monotonic() - start
        finally:
            thaw(frozen)
            traffic.stop()
        if not self.whole_again(start):
            self.problems.append(f"the pair did not serve again after {act}")
