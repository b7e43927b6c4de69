"""bench.kv_transfer's measuring loop: every method once per size per repetition, interleaved.

Why apart: what is timed and in which order (warm-up first, the order rotated so that no method
is always first, a GPU run stopped at its wall budget) is one concern; turning the seconds into
GB/s, ratios and verdicts (bench/_kv_ratios.py) is another.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bench import harness
from bench._kv_geometry import FORWARD_GEOMETRY, GPU_ALT_CHUNK, MIB, Geometry
from bench._kv_rigs import Pair, Pipeline

BESIDE = "raw_nixl_beside_forward"  # the CPU control (bench/kv_transfer.py's docstring)


@dataclass
class Measured:
    """Seconds per method and KV size, as the repetitions left them."""

    times: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    # name -> size -> repetition -> seconds
    by_rep: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    extra_e2e: dict[str, dict[int, list[float]]] = field(
        default_factory=lambda: {"decode": {}, "client": {}, "forward": {}}
    )
    errors: list[str] = field(default_factory=list)
    reps_done: int = 0
    ucx_labels: list[str] = field(default_factory=list)  # the UCX settings that had a pair


def measure(
    sizes: list[int],
    reps: int,
    settings: dict[str, dict[str, str]],
    *,
    geo: Geometry,
    device: str,
    budget_end: float,
) -> Measured:
    """Time every method on every size `reps` times (fewer once `budget_end` has passed)."""
    gpu = device.startswith("cuda")
    biggest = max(sizes)
    m = Measured()
    with harness.Workers() as workers:
        pipe = Pipeline(workers, kv_pages=biggest // geo.page_bytes + 8, geo=geo, device=device)
        pairs = {}
        try:
            for label, env in settings.items():
                extra = ["--transport", "--memcpy"] if label == "default" else []
                if label == "default" and not gpu:
                    extra += ["--forward-geometry", FORWARD_GEOMETRY]
                pairs[label] = Pair(workers.tmp, label, env, biggest, extra, geo=geo, device=device)
            pipe.wait()
            methods: list[tuple[str, Any]] = [("pdworker_e2e", pipe.time)]
            methods.append(("pdworker_transport", lambda n: pairs["default"].time("transport", n)))
            if gpu:  # one lease should also say whether bigger WRITEs would serve a GPU better
                methods.append((
                    f"pdworker_transport[{GPU_ALT_CHUNK // MIB}MiB chunks]",
                    lambda n: pairs["default"].time("transport", n, GPU_ALT_CHUNK),
                ))  # fmt: skip
            for label, pair in pairs.items():
                methods.append((f"raw_nixl[{label}]", lambda n, p=pair: p.time("raw", n)))
            if not gpu:
                methods.append((BESIDE, lambda n: pairs["default"].time("raw_beside_forward", n)))
            methods.append(("memcpy", lambda n: pairs["default"].time("memcpy", n)))
            for _, fn in methods:  # warm-up: connections, page faults, first-use costs
                fn(sizes[0])
                fn(biggest)
            for rep in range(reps):
                if time.monotonic() > budget_end:
                    m.errors.append(f"wall budget reached: {rep} of {reps} repetitions done")
                    break
                m.reps_done = rep + 1
                for i, size in enumerate(sizes):
                    k = (rep + i) % len(methods)  # rotate the order: no method is always first
                    for name, fn in methods[k:] + methods[:k]:
                        try:
                            got = fn(size)
                        except RuntimeError as exc:  # recorded, and the run goes on
                            m.errors.append(f"{name} {size // MIB} MiB: {exc}"[:400])
                            continue
                        if isinstance(got, dict):
                            m.extra_e2e["decode"].setdefault(size, []).append(got["decode"])
                            m.extra_e2e["client"].setdefault(size, []).append(got["client"])
                            if "forward" in got:
                                m.extra_e2e["forward"].setdefault(size, []).append(got["forward"])
                            got = got["prefill"]
                        m.times.setdefault(name, {}).setdefault(size, []).append(got)
                        m.by_rep.setdefault(name, {}).setdefault(size, {})[rep] = got
        finally:
            for pair in pairs.values():
                pair.close()
    m.ucx_labels = list(pairs)
    return m
