"""The CPU-box shims the e2e tier installs into the stock vLLM venv (e2e/vllm/build.sh), as units:
what each lets through and what it stops."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import pytest
from e2e.vllm import keep_affinity


def _call_from(module: str, fn: Callable[[int, Iterable[int]], None], pid: int) -> None:
    """Call fn(pid, {1}) from a frame whose module is `module`, as vLLM's code would."""
    namespace = {"__name__": module, "fn": fn}
    exec(f"fn({pid}, {{1}})", namespace)


def test_the_nixl_workers_pinning_of_its_own_thread_is_kept_off_and_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[tuple[int, set[int]]] = []
    guarded = keep_affinity.guard(lambda pid, mask: calls.append((pid, set(mask))))
    worker = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
    _call_from(worker, guarded, 0)
    _call_from(worker, guarded, 0)
    assert calls == []
    said = capsys.readouterr().err
    assert said.count(keep_affinity.ENV) == 1 and worker in said and "[1]" in said


@pytest.mark.parametrize(
    ("module", "pid"),
    [
        ("vllm.v1.worker.cpu_worker", 0),  # anyone else's pinning goes through
        ("psutil", 0),
        ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker", 4242),  # another pid
    ],
)
def test_every_other_affinity_call_goes_through(module: str, pid: int) -> None:
    calls: list[tuple[int, set[int]]] = []
    guarded = keep_affinity.guard(lambda p, mask: calls.append((p, set(mask))))
    _call_from(module, guarded, pid)
    assert calls == [(pid, {1})]


@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("", False), ("0", False)])
def test_the_shim_is_off_unless_the_pod_asks(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:

    real = os.sched_setaffinity
    monkeypatch.setattr(os, "sched_setaffinity", real)  # restored after the test
    assert keep_affinity.install({keep_affinity.ENV: value}) is on
    assert (os.sched_setaffinity is real) is not on
