"""Talk to a real SGLang PD pair the way sglang-router does in PD mode (tests only).

Why: the tier's checks need SGLang's PD protocol without a router in between (to prove the pods
and the transfer work before the stock router or pdwarden takes part), and a reader of SGLang's
/metrics. The protocol (sglang-router's PD mode): the same `/generate` body, with the prefill's
`bootstrap_host`, `bootstrap_port` and a random `bootstrap_room`, goes to prefill and decode at
once; the decode asks the prefill's bootstrap server where the KV is, the prefill writes it into
the decode's pool over NIXL, and the decode answers with the text.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from e2e.httpjson import http
from e2e.pdtools import scraped_sum
from e2e.sglang.pods import BOOTSTRAP_PORT, HTTP_PORT


def url(pod_ip: str, path: str) -> str:
    return f"http://{pod_ip}:{HTTP_PORT}{path}"


def pd_generate(
    prefill_ip: str, decode_ip: str, text: str, max_new_tokens: int = 8, timeout: float = 120
) -> dict[str, Any]:
    """One generation through SGLang's PD protocol; the decode's answer, AssertionError with
    SGLang's answers if either side fails."""
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        "bootstrap_host": prefill_ip,
        "bootstrap_port": BOOTSTRAP_PORT,
        "bootstrap_room": random.randrange(2**63),
    }
    answers: dict[str, tuple[int, Any]] = {}

    def leg(role: str, ip: str) -> None:
        answers[role] = http("POST", url(ip, "/generate"), body, timeout=timeout)

    legs = [
        threading.Thread(target=leg, args=(role, ip), daemon=True)
        for role, ip in (("prefill", prefill_ip), ("decode", decode_ip))
    ]
    for t in legs:
        t.start()
    for t in legs:
        t.join(timeout + 5)
    code, dec = answers.get("decode", (0, "no answer"))
    pcode, pre = answers.get("prefill", (0, "no answer"))
    assert pcode == 200, f"prefill answered {pcode}: {pre!r}"[:2000]
    assert code == 200 and isinstance(dec, dict), f"decode answered {code}: {dec!r}"[:2000]
    return dec


def metric(pod_ip: str, name: str, **labels: str) -> float:
    """Sum of the pod's samples of `name` matching `labels` (e2e/pdtools.py `scraped_sum`)."""
    return scraped_sum(url(pod_ip, "/metrics"), name, **labels)
