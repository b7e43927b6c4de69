"""The only layer that talks to the Kubernetes API (enforced by import-linter)."""

from pdwarden.k8s.client import ApiError, KubeClient, resource_path, throttled_budget

__all__ = ["ApiError", "KubeClient", "resource_path", "throttled_budget"]
