"""Talk to a real vLLM PD pair the way llm-d's sidecar and vLLM's example proxy do (tests only).

Why: the tier's checks need the PD protocol without a router in between (to prove the pods and
the transfer work before anything of ours routes), and a reader of vLLM's /metrics that sums a
series over its labels. The protocol: the request goes to prefill with
`kv_transfer_params.do_remote_decode` and max_tokens 1; its answer carries the
`kv_transfer_params` (remote engine id, block ids, side-channel host/port, request id) that the
same request then takes to decode, which pulls the KV with a NIXL READ.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from e2e.httpjson import http
from e2e.pdtools import scraped_sum
from e2e.vllm.pods import HTTP_PORT, SERVED_NAME

PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True)
class PDAnswer:
    prefill: dict[str, Any]
    decode: dict[str, Any]

    @property
    def kv_transfer_params(self) -> dict[str, Any]:
        return dict(self.prefill.get("kv_transfer_params") or {})

    @property
    def text(self) -> str:
        return str(self.decode["choices"][0]["text"])


def url(pod_ip: str, path: str) -> str:
    return f"http://{pod_ip}:{HTTP_PORT}{path}"


def pd_complete(
    prefill_ip: str, decode_ip: str, prompt: str, max_tokens: int = 16, timeout: float = 120
) -> PDAnswer:
    """One completion through the PD protocol; AssertionError with vLLM's answer if it fails."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_PARAMS}
    code, pre = http("POST", url(prefill_ip, "/v1/completions"), first, timeout=timeout)
    assert code == 200 and isinstance(pre, dict), f"prefill answered {code}: {pre!r}"[:2000]
    params = pre.get("kv_transfer_params")
    assert params, f"prefill gave no kv_transfer_params: {pre!r}"[:2000]
    second = {**body, "kv_transfer_params": params}
    code, dec = http("POST", url(decode_ip, "/v1/completions"), second, timeout=timeout)
    assert code == 200 and isinstance(dec, dict), f"decode answered {code}: {dec!r}"[:2000]
    return PDAnswer(pre, dec)


def metric(pod_ip: str, name: str, **labels: str) -> float:
    """Sum of the pod's samples of `name` matching `labels` (e2e/pdtools.py `scraped_sum`)."""
    return scraped_sum(url(pod_ip, "/metrics"), name, **labels)


def decode_leg_in_background(
    decode_ip: str, body: dict[str, Any], kv_transfer_params: dict[str, Any]
) -> tuple[threading.Thread, list[object]]:
    """The decode leg of `body` with the prefill's `kv_transfer_params`, sent from a daemon
    thread (for a read that may hang); its (status, answer) lands in the returned list."""
    answer: list[object] = []
    second = {**body, "kv_transfer_params": kv_transfer_params}
    leg = threading.Thread(
        target=lambda: answer.append(
            http("POST", url(decode_ip, "/v1/completions"), second, timeout=600)
        ),
        daemon=True,
    )
    leg.start()
    return leg, answer
