"""Tell NIXL that SGLang's "VRAM" KV pool is host memory, when asked by environment (CPU image).

Why: SGLang 0.5.23 registers its KV pool with NIXL as VRAM whatever the device
(disaggregation/decode.py:629 and disaggregation/nixl/conn.py `_normalize_kv_mem_kinds`). On a
CPU server that pool is host memory, and UCX refuses it ("VRAM memory is detected as host by
UCX" -> NIXL_ERR_BACKEND in `register_buffer_to_engine`). A GPU server's pool is VRAM, so this is
only for the local cluster's CPU pods, which set PDWARDEN_NIXL_HOST_MEMORY=1.

This module is copied into the SGLang tier's venv (e2e/sglang/build.sh) with a .pth line that
imports it at interpreter start; SGLang's and NIXL's files are never touched. When the variable is
set it waits for NIXL's Python API module (`nixl_cu1x._api`, which `nixl._api` aliases) to be
imported, and makes every agent built from then on map the memory types "VRAM" and "cuda" to the
host-memory segment in `nixl_agent.nixl_mems`, the table every registration and descriptor list
of that agent is built from.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from types import ModuleType
from typing import Any

ENV = "PDWARDEN_NIXL_HOST_MEMORY"


def _patch(module: ModuleType) -> None:
    agent = getattr(module, "nixl_agent", None)
    if agent is None or getattr(agent, "_pdwarden_host_memory", False):
        return
    init = agent.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        host = self.nixl_mems["DRAM"]
        self.nixl_mems["VRAM"] = self.nixl_mems["cuda"] = host

    agent.__init__ = __init__
    agent._pdwarden_host_memory = True


def _next_spec(me: Any, name: str, path: Any, target: Any) -> Any:
    for finder in sys.meta_path:
        if finder is not me and hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
    return None


class _Finder(importlib.abc.MetaPathFinder):
    """After a `nixl*._api` module executes, patch its `nixl_agent`."""

    busy = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if self.busy or not (name.startswith("nixl") and name.endswith("._api")):
            return None
        # Another finder of this kind asks the rest of sys.meta_path too: it must not ask back.
        self.busy = True
        try:
            spec = _next_spec(self, name, path, target)
        finally:
            self.busy = False
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get(ENV, "").strip() == "1":
    sys.meta_path.insert(0, _Finder())
