"""tests/ uses the session-wide `cluster` and per-test `namespace` fixtures from e2e.fixtures.

They are registered by the repository's root conftest.py; see e2e/fixtures.py for the interface
(`cluster.kubeconfig`, `cluster.kubectl(...)`, `cluster.wait_until(...)`).
"""
