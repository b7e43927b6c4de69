"""Shared pytest setup for tests/ and e2e/tests/: the Kubernetes fixtures live in e2e.fixtures,
the real vLLM pair of the vLLM tier in e2e.vllm.fixtures."""

pytest_plugins = ["e2e.fixtures", "e2e.vllm.fixtures"]
