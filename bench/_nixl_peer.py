"""Two-process NIXL peers for the KV transfer benchmark (a target and an initiator).

Why a separate process per side: the benchmark compares transfers between two processes, as
prefill and decode are, and UCX reads its transport settings (UCX_TLS) once per process. The
target registers a buffer, publishes its NIXL metadata and drains notifications the way
pdworker's transport does when busy; the initiator answers timing requests on stdin, one JSON
line each (answers are stdout lines prefixed `BENCH `, since NIXL itself may print there too):

* `raw`: one NIXL WRITE of the whole buffer (one descriptor) with a notification, busy-polled;
  the best this NIXL/UCX setup can do.
* `transport`: the same bytes through pdworker's own `NixlTransport` the way prefill moves one
  room: one WRITE per chunk of `--chunk-bytes` (whole pages of prepared page descriptor lists),
  every chunk posted at once, completions from its progress thread, then the final notification.
* `memcpy`: torch `copy_` of the same bytes inside the initiator (the memory bound; on CUDA
  followed by a synchronize).
* `raw_beside_forward` (with `--forward-geometry`): raw WRITEs of `--chunk-bytes` each, one
  after the other, while another thread of the initiator runs pdworker's tiny-model forward
  pass (`TinyModel.prefill_into`, into a pool of its own) without pause: what the hardware
  gives a prefill that computes its next chunk while it sends this one, as pdworker does.

`--device cuda` puts both buffers in VRAM (the two processes share one GPU).

Network: the metadata goes through a file; UCX is kept on loopback (UCX_NET_DEVICES=lo) exactly
as pdworker does for a loopback host.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch

from pdworker import hostmem
from pdworker.compute import indexed
from pdworker.transfer import DRAIN_ACTIVE_S as DRAIN_S
from pdworker.transfer import make_agent


def _zeros(size: int, device: torch.device) -> torch.Tensor:
    """A buffer of the memory pdworker's KV pool uses: VRAM, or host huge pages (`hostmem`),
    so raw NIXL and memcpy are measured on the same kind of pages as the worker."""
    if device.type == "cuda":
        return torch.zeros(size, dtype=torch.uint8, device=device)
    return hostmem.zeros((size,), torch.uint8)


def _device(args: argparse.Namespace) -> tuple[torch.device, str, int]:
    device = indexed(torch.device(args.device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        return device, "VRAM", device.index or 0
    return device, "DRAM", 0


def target(args: argparse.Namespace) -> None:
    name = f"bench-target-{os.getpid()}"
    agent = make_agent(name)  # as pdworker's: NIXL's own progress thread off
    device, mem_type, dev_id = _device(args)
    buf = _zeros(args.size, device)
    agent.register_memory(buf)
    meta = {
        "agent": name,
        "metadata": base64.b64encode(bytes(agent.get_agent_metadata())).decode(),
        "addr": int(buf.data_ptr()),
        "size": args.size,
        "mem_type": mem_type,
        "device_id": dev_id,
    }
    tmp = Path(str(args.meta) + ".tmp")
    tmp.write_text(json.dumps(meta))
    tmp.rename(args.meta)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    while not done.wait(DRAIN_S):  # progresses UCX as a busy pdworker transport does
        agent.get_new_notifs()


class Initiator:
    def __init__(self, args: argparse.Namespace) -> None:
        meta = json.loads(Path(args.meta).read_text())
        self.remote_name = meta["agent"]
        self.remote_addr = int(meta["addr"])
        metadata = base64.b64decode(meta["metadata"])
        self.page_bytes = args.page_bytes
        self.chunk_pages = max(1, args.chunk_bytes // args.page_bytes)
        self.device, self.mem_type, self.dev_id = _device(args)
        remote_dev = int(meta.get("device_id", 0))
        gen = torch.Generator().manual_seed(1)
        self.src = _zeros(args.size, self.device)
        self.src.copy_(torch.randint(0, 256, (args.size,), dtype=torch.uint8, generator=gen))
        self.raw = make_agent(f"bench-raw-{os.getpid()}")
        self.raw.register_memory(self.src)
        self.raw.add_remote_agent(metadata)
        self.remote_dev = remote_dev
        self.transport = None
        self.dst = None
        if args.transport:
            from pdworker.transfer import NixlTransport

            npages = args.size // self.page_bytes
            base = int(self.src.data_ptr())
            descs = [(base + i * self.page_bytes, self.page_bytes, self.dev_id)
                     for i in range(npages)]  # fmt: skip
            self.transport = NixlTransport(
                f"bench-pdw-{os.getpid()}", self.src, descs, self.mem_type
            )
            remote = [(self.remote_addr + i * self.page_bytes, self.page_bytes, remote_dev)
                      for i in range(npages)]  # fmt: skip
            self.transport.add_peer(self.remote_name, metadata, remote, self.mem_type)
        self.forward: _ForwardLoad | None = None
        if args.forward_geometry:
            self.forward = _ForwardLoad(args.forward_geometry, args.chunk_bytes, self.device)
        if args.memcpy:
            self.dst = _zeros(args.size, self.device)
            self.dst.copy_(self.src)  # touch the pages once
            self._sync()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _raw_write(self, offset: int, nbytes: int) -> float:
        """One NIXL WRITE of `nbytes` at `offset` in both buffers (one descriptor each),
        busy-polled; the seconds from creating the handle to its completion."""
        agent = self.raw
        local = agent.get_xfer_descs([(int(self.src.data_ptr()) + offset, nbytes, self.dev_id)],
                                     self.mem_type)  # fmt: skip
        remote = agent.get_xfer_descs([(self.remote_addr + offset, nbytes, self.remote_dev)],
                                      self.mem_type)  # fmt: skip
        t0 = time.perf_counter()
        handle = agent.initialize_xfer("WRITE", local, remote, self.remote_name, b"raw")
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        elapsed = time.perf_counter() - t0
        agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"raw NIXL WRITE ended in {state}")
        return elapsed

    def run_raw(self, nbytes: int) -> float:
        return self._raw_write(0, nbytes)

    def run_raw_beside_forward(self, nbytes: int, chunk_bytes: int = 0) -> float:
        assert self.forward is not None, "start the initiator with --forward-geometry"
        step = chunk_bytes or self.chunk_pages * self.page_bytes
        with self.forward.running():
            return sum(
                self._raw_write(offset, min(step, nbytes - offset))
                for offset in range(0, nbytes, step)
            )

    def run_transport(self, nbytes: int, chunk_bytes: int = 0) -> float:
        assert self.transport is not None, "start the initiator with --transport"
        pages = list(range(nbytes // self.page_bytes))
        step = max(1, chunk_bytes // self.page_bytes) if chunk_bytes else self.chunk_pages
        chunks = [pages[i : i + step] for i in range(0, len(pages), step)]
        finished = threading.Event()
        errors: list[str] = []
        left = [len(chunks)]
        lock = threading.Lock()

        def done(err: Any) -> None:
            with lock:
                left[0] -= 1
                if err is not None:
                    errors.append(str(err))
                if left[0] == 0:
                    finished.set()

        t0 = time.perf_counter()
        for index, chunk in enumerate(chunks):  # as prefill's shard thread posts one room
            self.transport.submit(self.remote_name, chunk, chunk, f"kv:1:{index}".encode(),
                                  timeout=30.0, done=done)  # fmt: skip
        if not finished.wait(60):
            raise RuntimeError("transport WRITEs did not finish in 60 s")
        if errors:
            raise RuntimeError(f"transport WRITE failed: {errors[0]}")
        self.transport.notify(self.remote_name, b"meta:1")
        return time.perf_counter() - t0

    def run_memcpy(self, nbytes: int) -> float:
        assert self.dst is not None, "start the initiator with --memcpy"
        self._sync()
        t0 = time.perf_counter()
        self.dst[:nbytes].copy_(self.src[:nbytes])
        self._sync()
        return time.perf_counter() - t0


class _ForwardLoad:
    """pdworker's forward pass run back to back on a thread of its own while `running`."""

    def __init__(self, geometry: str, chunk_bytes: int, device: torch.device) -> None:
        from pdworker.config import ModelConfig
        from pdworker.model import KVPool, TinyModel

        layers, heads, head_dim, page_tokens, dtype = geometry.split(",")
        cfg = ModelConfig(layers=int(layers), heads=int(heads), head_dim=int(head_dim),
                          page_size=int(page_tokens), vocab=1024, dtype=dtype)  # fmt: skip
        self.chunk_pages = max(1, chunk_bytes // cfg.page_bytes)
        self.tokens = [(i * 7919) % 1024 for i in range(self.chunk_pages * cfg.page_size)]
        self.model = TinyModel(cfg, device)
        self.pool = KVPool(cfg, 2 * self.chunk_pages, device)  # two chunks, written in turn
        self.device = device
        self._go = threading.Event()
        self._started = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        threading.Thread(target=self._main, name="forward-load", daemon=True).start()

    def _main(self) -> None:
        torch.set_num_threads(1)  # as pdworker's compute threads
        turn = 0
        while True:
            self._go.wait()
            self._idle.clear()
            while self._go.is_set():
                first = (turn % 2) * self.chunk_pages
                self._started.set()
                self.model.prefill_into(
                    self.pool, list(range(first, first + self.chunk_pages)), self.tokens
                )
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                turn += 1
            self._idle.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self._started.clear()
        self._go.set()
        self._started.wait()
        try:
            yield
        finally:
            self._go.clear()
            self._idle.wait()  # its last pass is over: it disturbs no other method


def initiator(args: argparse.Namespace) -> None:
    peer = Initiator(args)
    ops = {"raw": peer.run_raw, "transport": peer.run_transport, "memcpy": peer.run_memcpy,
           "raw_beside_forward": peer.run_raw_beside_forward}  # fmt: skip
    print("BENCH " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            args = [int(req["bytes"])]
            if req.get("chunk_bytes"):
                args.append(int(req["chunk_bytes"]))
            answer: dict[str, Any] = {"seconds": ops[req["op"]](*args)}
        except Exception as exc:  # report, keep serving
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print("BENCH " + json.dumps(answer), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["target", "initiator"])
    p.add_argument("--size", type=int, required=True, help="buffer bytes")
    p.add_argument("--meta", type=Path, required=True, help="target metadata file")
    p.add_argument("--page-bytes", type=int, default=512 * 1024)
    p.add_argument("--chunk-bytes", type=int, default=32 << 20, help="bytes per WRITE")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--transport", action="store_true")
    p.add_argument("--memcpy", action="store_true")
    p.add_argument(
        "--forward-geometry",
        default="",
        help="layers,heads,head_dim,page_tokens,dtype: enables raw_beside_forward",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.role == "target":
        target(args)
    else:
        initiator(args)


if __name__ == "__main__":
    main()
