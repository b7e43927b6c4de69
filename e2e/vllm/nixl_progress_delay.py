"""Let NIXL's UCX progress thread sleep in poll() instead of spinning, when asked by environment.

Why: NIXL's Python wrapper (nixl_cu1x/_api.py, `nixl_agent.__init__`) hard-codes
`agent_config.pthrDelay = 0`, and vLLM 0.32 builds its agent with the default
`enable_prog_thread=True` (distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:636-645)
and exposes no knob for either (`kv_connector_extra_config` has only `num_threads`). The UCX
backend's shared progress thread then calls poll(fds, 2, 0) in a loop: measured 64-99 % of a core
per idle `vllm serve` on these 2-core machines. pthrDelay is the poll() timeout in microseconds
(rounded up to milliseconds); the thread still wakes at once on UCX's event fds, so transfers and
notifications are progressed as before, only the idle spin stops.

This module is copied into the stock vLLM venv of the e2e tier (e2e/vllm/build.sh) with a .pth
line that imports it at interpreter start. It does nothing unless PDWARDEN_NIXL_PROGRESS_DELAY_US
is set (the local cluster's vLLM pods set it); vLLM's own code is never touched. When set, it
wraps the bindings module that `nixl_cu1x._api` binds as `nixlBind` as soon as that module is
imported, and raises pthrDelay of an agent whose progress thread is on and whose delay is 0.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from types import ModuleType
from typing import Any

ENV = "PDWARDEN_NIXL_PROGRESS_DELAY_US"


class _Bindings:
    """The real bindings module, with nixlAgent() giving a spinning progress thread a delay."""

    def __init__(self, real: ModuleType, delay_us: int) -> None:
        self._real = real
        self._delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def nixlAgent(self, name: str, config: Any) -> Any:
        if config.useProgThread and config.pthrDelay == 0:
            config.pthrDelay = self._delay_us
        return self._real.nixlAgent(name, config)


def _next_spec(me: Any, name: str, path: Any, target: Any) -> Any:
    for finder in sys.meta_path:
        if finder is not me and hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
    return None


class _Finder(importlib.abc.MetaPathFinder):
    """After `nixl_cu1x._api` executes, swap its `nixlBind` for the wrapper."""

    def __init__(self, delay_us: int) -> None:
        self.delay_us = delay_us
        self.busy = False

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
        delay_us = self.delay_us

        def exec_module(module: ModuleType) -> None:
            run(module)
            bind = getattr(module, "nixlBind", None)
            if isinstance(bind, ModuleType):
                module.nixlBind = _Bindings(bind, delay_us)  # type: ignore[attr-defined]

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return
    try:
        delay_us = int(raw)
    except ValueError:
        print(f"{ENV}={raw!r} is not an integer number of microseconds; ignored", file=sys.stderr)
        return
    if delay_us > 0:
        sys.meta_path.insert(0, _Finder(delay_us))


install()
