"""CLI behaviour and the small pure parts: faults, admin bodies, discovery, KV pool layout."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from pdworker.contract import DEFAULT_HTTP_PORT as PORT
from pdworker.discovery import parse_endpoints, ready_pod_urls
from pdworker.faults import Faults, FaultSpecError, parse_faults
from pdworker.model import KVPool, ModelConfig, TinyModel
from pdworker.server import BadRequest, FailSelector, parse_fail_body


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdworker.cli", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_unknown_options_and_faults_are_named() -> None:
    out = cli("load", "--bogus")
    assert out.returncode == 2 and "--bogus" in out.stderr
    out = cli("prefill", "--fault", "legacy-status-race,made-up")
    assert out.returncode == 2 and "made-up" in out.stderr and "legacy-status-race" in out.stderr
    out = cli("decode", "--prefill-allow", "127.0.0.1:1,nonsense")
    assert out.returncode == 2 and "'nonsense' is neither ip:port nor a network" in out.stderr
    out = cli("prefill", "--max-rooms", "0")
    assert out.returncode == 2 and "--max-rooms" in out.stderr


@pytest.mark.parametrize("command", ["prefill", "decode", "router", "load"])
def test_help_documents_flags(command: str) -> None:
    out = cli(command, "--help")
    assert out.returncode == 0
    flags = {
        "prefill": ["--host", "--port", "--bootstrap-port", "--admin-token-file", "--fault",
                    "--inflight-timeout", "--transfer-timeout", "--peer-timeout", "--kv-pages"],
        "decode": ["--waiting-timeout", "--heartbeat-interval", "--abort-ack-timeout", "POD_IP",
                   "--bootstrap-token-file", "PDWORKER_BOOTSTRAP_TOKEN_FILE", "--prefill-allow",
                   "--max-rooms"],
        "router": ["--prefill", "--decode", "--discovery", "--prefill-selector"],
        "load": ["--clients", "--requests", "--duration", "--cancel-fraction", "--json"],
    }[command]  # fmt: skip
    for flag in flags:
        assert flag in out.stdout, flag


def test_parse_faults() -> None:
    assert parse_faults([""]) == Faults()
    f = parse_faults(["legacy-status-race", "no-inflight-watchdog,decode-stall=5"])
    assert f.legacy_status_race and f.no_inflight_watchdog
    assert f.decode_stall and f.decode_stall_after == 5
    assert parse_faults(["drop-notifications=0.25"]).drop_notifications == 0.25
    assert parse_faults(["corrupt-kv=1"]).corrupt_kv == 1.0
    assert parse_faults(["corrupt-kv=0.5"]).names() == ["corrupt-kv=0.5"]
    assert parse_faults(["decode-stall"]).decode_stall_after is None
    for bad in ("nope", "drop-notifications", "drop-notifications=2", "decode-stall=x",
                "legacy-status-race=1"):  # fmt: skip
        with pytest.raises(FaultSpecError):
            parse_faults([bad])


def test_parse_fail_body() -> None:
    assert parse_fail_body({"rooms": [1, "2"]}) == FailSelector(rooms=[1, 2])
    assert parse_fail_body({"older_than_seconds": 0}) == FailSelector(older_than_seconds=0.0)
    assert parse_fail_body({"peer_incarnation": "d-1"}) == FailSelector(peer_incarnation="d-1")
    for bad in (None, [], {}, {"rooms": [1], "peer_incarnation": "x"}, {"rooms": [1.5]}):
        with pytest.raises(BadRequest):
            parse_fail_body(bad)


def _pod(ip: str, ready: str, phase: str = "Running", deleting: bool = False) -> dict:
    return {
        "metadata": {"deletionTimestamp": "now" if deleting else None},
        "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_kubernetes_discovery_uses_ready_pods_only() -> None:
    pods = [
        _pod("127.244.1.5", "True"),
        _pod("127.244.1.6", "False"),  # cordoned by the readiness gate
        _pod("127.244.1.7", "True", phase="Pending"),
        _pod("127.244.1.8", "True", deleting=True),
        _pod("", "True"),
        SimpleNamespace(  # the kubernetes client's objects use snake_case attributes
            metadata=SimpleNamespace(deletion_timestamp=None),
            status=SimpleNamespace(
                phase="Running",
                pod_ip="127.244.1.9",
                conditions=[SimpleNamespace(type="Ready", status="True")],
            ),
        ),
    ]
    assert ready_pod_urls(pods, PORT) == [
        f"http://127.244.1.5:{PORT}",
        f"http://127.244.1.9:{PORT}",
    ]
    assert parse_endpoints("127.0.0.1:1, http://a:2/") == ["http://127.0.0.1:1", "http://a:2"]


def test_kv_pool_roundtrip_and_chunked_prefill_matches() -> None:
    # Chunked prefill equals the whole prompt's KV up to float rounding: the CPU matmul kernels
    # pick their blocking by row count, so the last bits may differ (seen here with 1 thread as
    # well). Tests that need exact bytes compute in the worker's own chunks (test_integrity).
    cfg = ModelConfig(layers=2, heads=2, head_dim=8, page_size=4, vocab=64)
    model = TinyModel(cfg, torch.device("cpu"))
    ids = list(range(11))
    kv, _ = model.prefill(ids)
    a, _ = model.prefill_chunk(ids[:8])
    b, _ = model.prefill_chunk(ids[8:])
    torch.testing.assert_close(torch.cat([a, b], dim=2), kv)
    pool = KVPool(cfg, 16, torch.device("cpu"))
    pages = [9, 2, 5]
    pool.write_tokens(pages, kv)
    assert torch.equal(pool.read_tokens(pages, 11), kv)
    descs = pool.page_descs()
    assert len(descs) == 16 and descs[1][0] - descs[0][0] == cfg.page_bytes
