"""pdwarden: a Kubernetes operator that keeps prefill/decode disaggregated serving unwedged."""

__version__ = "0.1.0"
