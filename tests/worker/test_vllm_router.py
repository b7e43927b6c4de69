"""The router's vLLM mode builds vLLM's two PD legs from one OpenAI request (pure parts).

The legs were checked against real vLLM 0.32 pods in e2e/tests/test_vllm_pair.py; here: what
each leg carries, and that a prefill without a KV connector is a clear error, not a decode that
silently recomputes.
"""

from __future__ import annotations

import pytest

from pdworker.server import BadRequest
from pdworker.vllm_router import decode_request, prefill_request

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 64,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_prefill_leg_asks_for_one_token_kept_for_a_remote_decode() -> None:
    leg = prefill_request(CHAT)
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert leg["kv_transfer_params"]["do_remote_prefill"] is False
    assert leg["max_tokens"] == 1 and leg["max_completion_tokens"] == 1
    assert leg["stream"] is False and "stream_options" not in leg
    assert leg["messages"] == CHAT["messages"]
    assert CHAT["stream"] is True and "kv_transfer_params" not in CHAT  # the original is intact


def test_decode_leg_is_the_original_request_with_prefills_params() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [[1]],
              "remote_host": "10.0.0.7", "remote_port": 5600}  # fmt: skip
    leg = decode_request(CHAT, {"kv_transfer_params": params})
    assert leg["kv_transfer_params"] == params
    assert leg["max_completion_tokens"] == 64 and leg["stream"] is True


@pytest.mark.parametrize("answer", [{}, {"kv_transfer_params": None}, {"kv_transfer_params": {}}])
def test_a_prefill_without_kv_connector_is_refused(answer: dict[str, object]) -> None:
    with pytest.raises(BadRequest, match="kv_transfer_params"):
        decode_request(CHAT, answer)
