"""Shared pytest setup for tests/ and e2e/tests/: the Kubernetes fixtures live in e2e.fixtures,
the real vLLM pair of the vLLM tier in e2e.vllm.fixtures, the real SGLang pair in
e2e.sglang.fixtures."""

pytest_plugins = ["e2e.fixtures", "e2e.vllm.fixtures", "e2e.sglang.fixtures"]
