"""The flag table keeps the command line as it was: same --help, same parsed values, same configs.

The goldens in cli_golden/ were written by the command line as it stood before the flags became a
table (`cli_golden/parsed.json`: what each argv in ARGVS parses to and the config it builds);
`{hostname}` and `{compute_threads}` stand for the two host-dependent defaults. A deliberate
change to a flag updates the golden in the same commit, where review sees it:
`PDWORKER_WRITE_GOLDEN=1 pytest tests/worker/test_cli_table.py` rewrites them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdworker import cli
from pdworker.config import DEFAULT_COMPUTE_THREADS, ModelConfig, WorkerConfig
from pdworker.flag_table import FLAGS
from pdworker.flags import Env
from pdworker.load import LoadConfig
from pdworker.secret_file import Secret

GOLDEN = Path(__file__).parent / "cli_golden"
WRITE = os.environ.get("PDWORKER_WRITE_GOLDEN") == "1"
ENV_DEFAULTS = ("POD_IP", "POD_NAME", "POD_NAMESPACE", "PDWORKER_PORT", "PDWORKER_BOOTSTRAP_PORT",
                "PDWORKER_ADMIN_TOKEN_FILE", "PDWORKER_BOOTSTRAP_TOKEN_FILE", "PDWORKER_FAULTS",
                "PDWORKER_LOG_LEVEL")  # fmt: skip
ARGVS = {
    "prefill-defaults": ["prefill"],
    "decode-defaults": ["decode"],
    "router-defaults": ["router"],
    "load-defaults": ["load"],
    "prefill-all": ["prefill", "--host", "10.1.2.3", "--port", "9001", "--log-level", "debug",
        "--bootstrap-port", "9002", "--pod-name", "p-7", "--layers", "3", "--heads", "5",
        "--head-dim", "8", "--page-size", "32", "--vocab", "77", "--seed", "9", "--dtype",
        "bfloat16", "--device", "cpu", "--kv-pages", "99", "--chunk-bytes", "4MiB",
        "--chunk-pages", "3", "--kv-verify", "full", "--compute-threads", "0",
        "--torch-threads", "4", "--prefill-chunk-ms", "1.5", "--decode-token-ms", "2.5",
        "--max-running", "7", "--nixl-backend", "GDS", "--transfer-threads", "6",
        "--bootstrap-timeout", "1", "--waiting-timeout", "2", "--inflight-timeout", "3",
        "--transfer-timeout", "4", "--abort-ack-timeout", "5", "--heartbeat-interval", "6",
        "--heartbeat-failures", "7", "--peer-timeout", "8", "--admin-token-file", "/nonexistent/a",
        "--bootstrap-token-file", "/nonexistent/b", "--max-rooms", "12",
        "--fault", "legacy-status-race", "--fault", "decode-stall=3,drop-notifications=0.5"],
    "decode-all": ["decode", "--host", "10.1.2.4", "--port", "9003", "--pod-name", "d-1",
        "--chunk-bytes", "1g", "--prefill-allow", "10.0.0.0/8, 127.0.0.1:5", "--max-rooms", "3",
        "--fault", "corrupt-kv=0.25"],
    "router-all": ["router", "--host", "0.0.0.0", "--port", "1", "--prefill", "a:1,b:2",
        "--decode", "c:3", "--discovery", "kubernetes", "--namespace", "ns",
        "--prefill-selector", "x=y", "--decode-selector", "z=w", "--worker-port", "9",
        "--request-timeout", "3.5"],
    "load-all": ["load", "--url", "http://x:1", "--clients", "3", "--requests", "4",
        "--duration", "5", "--prompt-len", "3:4", "--output-len", "2", "--cancel-fraction", "0.5",
        "--cancel-max-ms", "9", "--timeout", "8", "--vocab", "100", "--seed", "4",
        "--json", "/tmp/x"],
}  # fmt: skip


def _host_values(text: str) -> str:
    return text.replace("{hostname}", socket.gethostname()).replace(
        '"{compute_threads}"', str(DEFAULT_COMPUTE_THREADS)
    )


def _plain(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return obj.current()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("command", ["top", "prefill", "decode", "router", "load"])
def test_help_is_unchanged(command: str) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "COLUMNS": "80", "HOME": os.environ.get("HOME", "")}
    argv = [sys.executable, "-m", "pdworker.cli", *([] if command == "top" else [command])]
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, env=env,
                         timeout=120, check=True)  # fmt: skip
    here = f"here {DEFAULT_COMPUTE_THREADS})"
    if WRITE:
        (GOLDEN / f"{command}.help").write_text(out.stdout.replace(here, "here {compute_threads})"))
    expected = (GOLDEN / f"{command}.help").read_text()
    assert out.stdout == expected.replace("here {compute_threads})", here)


def test_every_flag_parses_and_configures_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    parsed = {}
    for name, argv in ARGVS.items():
        args = cli.build_parser().parse_args(argv)
        got: dict[str, Any] = {"args": _plain(vars(args))}
        if args.command in ("prefill", "decode"):
            got["config"] = _plain(cli.worker_config(args))
            got["config"].pop("incarnation")
        parsed[name] = got
    if WRITE:
        _write_parsed(parsed)
    golden = json.loads(_host_values((GOLDEN / "parsed.json").read_text()))
    assert set(golden) == set(ARGVS)
    for name, got in parsed.items():
        assert got == golden[name], name


def _write_parsed(parsed: dict[str, Any]) -> None:
    """The golden with the host-dependent values as placeholders (where they are defaults)."""
    out = json.loads(json.dumps(parsed))
    for name, entry in out.items():
        for part in entry.values():
            for key in ("pod_name", "pod"):
                if part.get(key) == socket.gethostname():
                    part[key] = "{hostname}"
            if "--compute-threads" not in ARGVS[name] and "compute_threads" in part:
                part["compute_threads"] = "{compute_threads}"
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    (GOLDEN / "parsed.json").write_text(text)


def test_environment_defaults_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDWORKER_PORT", "9123")
    monkeypatch.setenv("POD_IP", "10.9.8.7")
    monkeypatch.setenv("PDWORKER_FAULTS", "decode-stall")
    cfg = cli.worker_config(cli.build_parser().parse_args(["decode"]))
    assert (cfg.port, cfg.host, cfg.faults.decode_stall) == (9123, "10.9.8.7", True)


def test_table_defaults_agree_with_the_config_dataclasses() -> None:
    """A default lives in the table; where a config dataclass declares one too, they agree."""
    declared = {
        **{f.name: f.default for f in dataclasses.fields(WorkerConfig)},
        **{f"model.{f.name}": f.default for f in dataclasses.fields(ModelConfig)},
    }
    load = {f.name: f.default for f in dataclasses.fields(LoadConfig)}
    checked = 0
    for flag in FLAGS:
        if flag.field is None or isinstance(flag.default, Env) or flag.convert is not None:
            continue
        if flag.name == "--requests":  # None on the command line: 100 unless --duration is given
            continue
        if set(flag.commands) <= {"prefill", "decode"}:
            table = declared
        elif flag.commands == ("load",):
            table = load
        else:
            continue  # RouterConfig declares no defaults: the table is its only source
        if table.get(flag.field, dataclasses.MISSING) is dataclasses.MISSING:
            continue
        assert table[flag.field] == flag.default, flag.name
        checked += 1
    assert checked >= 25
