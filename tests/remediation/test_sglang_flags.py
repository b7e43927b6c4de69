"""An SGLang prefill's launch flags decide whether a decode backlog can excuse its inflight queue.

SGLang 0.5.23 parks prefilled rooms in the inflight queue before their decode allocated KV only
with optimistic prefill (`--optimistic-prefill-attempts` > 0, not with `--pp-size` > 1) or
`--disaggregation-decode-allocation-policy prefill_complete` (disaggregation/prefill.py:484-494,
arg_groups/pd_disaggregation_hook.py:47-55, arg_groups/serving_hook.py:503-512). The flags are
read from the pod as SGLang's argparse reads them; anything unknowable keeps the excuse.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
from e2e import sglang_source

from pdwarden.constants import WORKER_PORT
from pdwarden.engines import sglang_flags as sglang_args
from pdwarden.remediation.memory import WorkerPod, pod_views, scrape_targets

RENDERED = ["python3", "-m", "sglang.launch_server", "--model-path", "m",
            "--disaggregation-mode", "prefill", "--port", str(WORKER_PORT)]  # fmt: skip


def sglang_pod(
    *args: str, command: list[str] | None = None, role: str = "prefill"
) -> dict[str, Any]:
    container = {"name": "sglang", "command": RENDERED if command is None else command,
                 "args": list(args)}  # fmt: skip
    return {
        "metadata": {"name": "p-0", "uid": "uid-p-0", "labels": {"pdwarden.dev/role": role}},
        "spec": {"containers": [{"name": "sidecar", "command": ["envoy"]}, container]},
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }


@pytest.mark.parametrize(
    ("args", "waits"),
    [
        ((), False),  # the defaults: rooms enter inflight only after decode allocated
        (("--optimistic-prefill-attempts", "2"), True),
        (("--optimistic-prefill-attempts=1",), True),
        (("--op", "3"), True),  # argparse accepts any unambiguous prefix
        (("--optimistic-prefill-attempts", "0"), False),
        (("--optimistic-prefill-attempts", "2", "--optimistic-prefill-attempts", "0"), False),
        (("--disaggregation-decode-allocation-policy", "prefill_complete"), True),
        (("--disaggregation-decode-allocation-policy=early",), False),
        (("--optimistic-prefill-attempts", "2", "--pp-size", "2"), False),  # SGLang turns it off
        (("--optimistic-prefill-attempts", "2", "--pipeline-parallel-size=2"), False),
        (("--optimistic-prefill-attempts", "2", "--pp-size", "2", "--pp-size", "1"), True),
        (("--config", "/etc/sglang.yaml"), True),  # the file may set anything
        (("--optimistic-prefill-attempts", "many"), True),  # not a number: cannot tell
        (("--opt-in-something",), False),  # not a prefix of the flag: not it
    ],
)
def test_flags_decide_whether_rooms_wait_for_decode_kv(args: tuple[str, ...], waits: bool) -> None:
    assert sglang_args.rooms_wait_for_decode_kv(sglang_pod(*args)) is waits


def test_a_shell_one_liner_is_read_like_a_command_line() -> None:
    script = "exec python3 -m sglang.launch_server --model-path m --optimistic-prefill-attempts 1"
    assert sglang_args.rooms_wait_for_decode_kv(sglang_pod(command=["sh", "-c", script]))
    plain = "exec python3 -m sglang.launch_server --model-path m"
    assert not sglang_args.rooms_wait_for_decode_kv(sglang_pod(command=["sh", "-c", plain]))


def test_sglang_serve_is_an_sglang_command_line_too() -> None:
    assert not sglang_args.rooms_wait_for_decode_kv(sglang_pod(command=["sglang", "serve"]))


def test_a_pod_without_an_sglang_command_line_keeps_the_excuse() -> None:
    assert sglang_args.rooms_wait_for_decode_kv(sglang_pod(command=["/entrypoint.sh"]))
    assert sglang_args.rooms_wait_for_decode_kv({"spec": {"containers": "garbage"}})
    assert sglang_args.rooms_wait_for_decode_kv({})


def test_the_setting_reaches_detection_through_the_scrape_targets() -> None:
    """The cycle lists pods every time: the flag travels on WorkerPod, then on PodView."""
    pods = [
        sglang_pod(),
        {
            **sglang_pod(),
            "metadata": {
                "name": "p-1",
                "uid": "uid-p-1",
                "labels": {"pdwarden.dev/role": "prefill"},
            },
        },
    ]
    pods[1]["spec"]["containers"][1]["args"] = ["--optimistic-prefill-attempts", "1"]
    targets = scrape_targets(pods, "sglang")
    assert [t.rooms_wait_for_decode_kv for t in targets] == [False, True]
    from pdwarden.remediation.memory import DeploymentMemory

    views = pod_views(targets, {}, DeploymentMemory(), 0.0, 5.0)
    assert [v.rooms_wait_for_decode_kv for v in views] == [False, True]
    # pdworker prefills are judged by their rooms API: the excuse is left as it was.
    assert scrape_targets([sglang_pod()], "pdworker")[0].rooms_wait_for_decode_kv
    assert WorkerPod("d", "u", "decode", "ip", False).rooms_wait_for_decode_kv


@pytest.mark.parametrize(
    ("args", "port"),
    [
        ((), 8998),  # SGLang's default
        (("--disaggregation-bootstrap-port", "9100"), 9100),
        (("--disaggregation-bootstrap-port=9101",), 9101),
        (("--disaggregation-b", "9102"), 9102),  # a prefix argparse accepts
        (("--disaggregation-bootstrap-port", "9100", "--disaggregation-bootstrap-port", "9"), 9),
        (("--disaggregation-bootstrap-port", "http"), 0),  # not a port: unknown
        (("--disaggregation-bootstrap-port", "70000"), 0),
        (("--config", "/etc/sglang.yaml"), 0),  # the file may set it
    ],
)
def test_the_bootstrap_port_is_read_from_the_command_line(args: tuple[str, ...], port: int) -> None:
    """Where the pair canary's KV request sends the decode to find the room (0: unknown, and
    no KV request is sent)."""
    assert sglang_args.bootstrap_port(sglang_pod(*args)) == port
    assert sglang_args.bootstrap_port(sglang_pod(command=["/entrypoint.sh"])) == 0
    [target] = scrape_targets([sglang_pod(*args)], "sglang")
    assert target.bootstrap_port == port
    # Only a prefill serves rooms; other engines' canaries carry the prefill's address.
    assert scrape_targets([sglang_pod(*args, role="decode")], "sglang")[0].bootstrap_port == 0
    assert scrape_targets([sglang_pod(*args)], "vllm")[0].bootstrap_port == 0


def test_the_default_bootstrap_port_is_the_real_servers() -> None:
    try:
        root = sglang_source.source_dir()
    except sglang_source.SourceUnavailable as e:
        pytest.skip(f"sglang {sglang_source.VERSION} wheel not reachable: {e}")
    tree = ast.parse((root / "sglang/srt/arg_groups/fields/disagg.py").read_text())
    [default] = [
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        and node.target.id == "disaggregation_bootstrap_port"
    ]  # fmt: skip
    assert isinstance(default, ast.Constant)
    assert default.value == sglang_args.DEFAULT_BOOTSTRAP_PORT


def _flags_of_the_real_server() -> set[str]:
    try:
        root = sglang_source.source_dir()
    except sglang_source.SourceUnavailable as e:
        pytest.skip(f"sglang {sglang_source.VERSION} wheel not reachable: {e}")
    flags: set[str] = set()
    for path in (root / "sglang/srt/arg_groups/fields").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                flags.add("--" + node.target.id.replace("_", "-"))
                for sub in ast.walk(node.annotation):
                    if isinstance(sub, ast.keyword) and sub.arg == "aliases":
                        flags |= {e.value for e in sub.value.elts}  # type: ignore[attr-defined]
    return flags


def test_the_shortest_prefixes_are_those_argparse_accepts_in_0_5_23() -> None:
    """Each table entry names exactly one flag of the real server, and one character less names
    more than one (argparse refuses an ambiguous prefix, so that is where it stops)."""
    flags = _flags_of_the_real_server()
    for flag, shortest in (*sglang_args.OPTIMISTIC, *sglang_args.ALLOCATION, *sglang_args.PP_SIZE,
                           *sglang_args.BOOTSTRAP_PORT):  # fmt: skip
        assert flag in flags
        assert [f for f in flags if f.startswith(shortest)] == [flag], shortest
        assert len([f for f in flags if f.startswith(shortest[:-1])]) > 1, shortest
