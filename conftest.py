"""Shared pytest setup for tests/ and e2e/tests/: the Kubernetes fixtures live in e2e.fixtures."""

pytest_plugins = ["e2e.fixtures"]
