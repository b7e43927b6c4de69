"""The processes bench.kv_transfer times: NIXL peer pairs and a router-prefill-decode pipeline.

A `Pair` drives bench._nixl_peer's target and initiator under one UCX setting (raw NIXL, the
worker's transport, memcpy); a `Pipeline` sends one room at a time through real workers and reads
each side's own transfer histogram.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from e2e.httpjson import http

from bench import harness
from bench._kv_geometry import CHUNK_BYTES, CPU_GEOMETRY, Geometry, worker_flags
from pdworker import contract as pdw


class Pair:
    """A NIXL target and initiator process under one UCX setting."""

    def __init__(self, tmp: Path, label: str, env: dict[str, str], size: int, extra: list[str],
                 *, geo: Geometry = CPU_GEOMETRY, device: str = "cpu"):  # fmt: skip
        self.label = label
        meta = tmp / f"meta-{label.replace(',', '_')}.json"
        full_env = {**os.environ, "UCX_NET_DEVICES": "lo", **env}
        cmd = [sys.executable, "-m", "bench._nixl_peer"]
        common_args = ["--size", str(size), "--meta", str(meta), "--page-bytes",
                       str(geo.page_bytes), "--device", device]  # fmt: skip
        self.logs = [open(tmp / f"{label}-{r}.log", "wb") for r in ("target", "initiator")]  # noqa: SIM115
        self.target = subprocess.Popen(
            [*cmd, "target", *common_args], stdin=subprocess.PIPE, stdout=self.logs[0],
            stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
        )  # fmt: skip
        harness.wait_for(lambda: meta.exists() or self.target.poll() is not None, 120, "target")
        if self.target.poll() is not None:
            raise RuntimeError(f"NIXL target ({label}) exited: {self._log(0)}")
        self.init = subprocess.Popen(
            [*cmd, "initiator", *common_args, "--chunk-bytes", str(CHUNK_BYTES), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.logs[1], env=full_env,
            text=True, start_new_session=True,
        )  # fmt: skip
        self._answer()

    def _log(self, i: int) -> str:
        self.logs[i].flush()
        return Path(self.logs[i].name).read_text()[-2000:]

    def _answer(self) -> dict[str, Any]:
        out: TextIO | None = self.init.stdout
        assert out is not None
        while True:
            line = out.readline()
            if not line:
                raise RuntimeError(f"NIXL initiator ({self.label}) exited: {self._log(1)}")
            if line.startswith("BENCH "):
                answer: dict[str, Any] = json.loads(line[6:])
                return answer

    def time(self, op: str, nbytes: int, chunk_bytes: int = 0) -> float:
        assert self.init.stdin is not None
        req = {"op": op, "bytes": nbytes, "chunk_bytes": chunk_bytes}
        self.init.stdin.write(json.dumps(req) + "\n")
        self.init.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{op} {nbytes} ({self.label}): {answer['error']}")
        return float(answer["seconds"])

    def close(self) -> None:
        for p in (self.init, self.target):
            if p.stdin:
                p.stdin.close()
        for p in (self.init, self.target):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for fh in self.logs:
            fh.close()


class Pipeline:
    """prefill + decode + router; one room of a given KV size at a time."""

    def __init__(self, workers: harness.Workers, kv_pages: int, geo: Geometry = CPU_GEOMETRY,
                 device: str = "cpu") -> None:  # fmt: skip
        flags = worker_flags(kv_pages, geo, device)
        self.geo = geo
        self.workers = workers
        self.prefill = workers.worker("prefill", *flags)
        self.decode = workers.worker("decode", *flags)
        self.router = workers.router([self.prefill], [self.decode])

    def wait(self) -> None:
        self.workers.wait_ready(self.prefill, self.decode, self.router)

    def time(self, nbytes: int) -> dict[str, float]:
        tokens = nbytes // self.geo.token_bytes
        ids = [(i * 7919) % 1024 for i in range(tokens)]
        name = pdw.KV_TRANSFER_SECONDS
        forward = pdw.PREFILL_FORWARD_SECONDS
        before = [harness.scrape(w.url) for w in (self.prefill, self.decode)]
        t0 = time.perf_counter()
        status, answer = http(
            "POST", f"{self.router.url}/generate", {"input_ids": ids, "max_new_tokens": 1},
            timeout=300,
        )  # fmt: skip
        client = time.perf_counter() - t0
        if status != 200 or not answer.get("ok") or answer.get("kv_bytes") != nbytes:
            raise RuntimeError(f"request of {nbytes} bytes failed: {status} {str(answer)[:300]}")
        out = {"client": client}
        # Prefill observes its forward time with its transfer time, before it answers.
        after = harness.scrape(self.prefill.url)

        def delta(series: str) -> float:
            return harness.metric(after, series) - harness.metric(before[0], series)

        if delta(f"{forward}_count") == 1:  # one room at a time
            out["forward"] = delta(f"{forward}_sum")
        for role, w, b in zip(
            ("prefill", "decode"), (self.prefill, self.decode), before, strict=True
        ):

            def observed(w: harness.Proc = w, b: harness.Samples = b) -> bool:
                a = harness.scrape(w.url)
                return harness.metric(a, f"{name}_count") > harness.metric(b, f"{name}_count")

            harness.wait_for(observed, 30, f"{role} transfer observation")
            a = harness.scrape(w.url)
            count = harness.metric(a, f"{name}_count") - harness.metric(b, f"{name}_count")
            total = harness.metric(a, f"{name}_sum") - harness.metric(b, f"{name}_sum")
            out[role] = total / count
        return out
