"""pdworker: a reference prefill/decode KV-transfer worker that moves real KV tensors over NIXL."""

__version__ = "0.1.0"
