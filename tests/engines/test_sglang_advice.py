"""SGLang settings that switch its own safety nets off: each rule fires, a near miss does not.

The rules (operator/pdwarden/engines/sglang_advice.py) read the pod's SGLang command line and its
literal environment as SGLang 0.5.23 reads them; a pod whose settings cannot be read is never
flagged. The flags' shortest prefixes are checked against the wheel like sglang_flags' are.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
from e2e import sglang_source

from pdwarden.api import parse_spec
from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL, WORKER_PORT
from pdwarden.engines import sglang_advice as advice
from pdwarden.engines import sglang_flags
from pdwarden.engines.sglang import ENGINE

Env = dict[str, str]


def sglang_pod(
    *args: str,
    mode: str | None = "decode",
    env: Env | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    launch = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--port",
              str(WORKER_PORT)]  # fmt: skip
    if mode is not None:
        launch += ["--disaggregation-mode", mode]
    container = {
        "name": "sglang",
        "command": launch if command is None else command,
        "args": list(args),
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    return {
        "metadata": {"name": "d-0", "uid": "uid-d-0"},
        "spec": {"containers": [{"name": "sidecar", "command": ["envoy"]}, container]},
    }


def fired(pod: dict[str, Any]) -> list[str]:
    return [a.rule.name for a in advice.advisories(pod)]


@pytest.mark.parametrize(
    ("mode", "env", "args", "rules"),
    [
        # The bootstrap timeout bounds a prefill's rooms waiting for their decode.
        ("prefill", {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "100000"}, (),
         ["SGLangBootstrapTimeoutHuge"]),
        ("prefill", {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3600"}, (), []),  # near miss
        ("decode", {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "100000"}, (), []),  # unused there
        ("prefill", {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "1e9"}, (), []),  # not an int
        # The waiting timeout bounds a decode's wait for KV (and a prefill's under
        # prefill_complete).
        ("decode", {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"}, (),
         ["SGLangWaitingTimeoutHuge"]),
        ("decode", {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "600"}, (), []),  # SGLang's own tip
        ("prefill", {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"}, (), []),
        ("prefill", {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"},
         ("--disaggregation-decode-allocation-policy", "prefill_complete"),
         ["SGLangWaitingTimeoutHuge"]),
        # The heartbeat: floored at 2 s x 1, judged against the 300 s waiting timeout.
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "150"}, (),
         ["SGLangHeartbeatTooSlow"]),
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "149"}, (), []),  # 298 s
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "150"}, (),
         ["SGLangHeartbeatTooSlow"]),  # 5 s x 150
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.1",
                    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "149"}, (), []),  # 2 s x 149
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "inf"}, (),
         ["SGLangHeartbeatTooSlow"]),
        ("decode", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "nan"}, (),
         ["SGLangHeartbeatTooSlow"]),
        ("prefill", {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1000"}, (), []),  # decode's
        # The watchdog crashes a server whose forward batch hangs.
        ("decode", {}, ("--watchdog-timeout", "100000"), ["SGLangWatchdogTimeoutHuge"]),
        ("prefill", {}, ("--watchdog-timeout=inf",), ["SGLangWatchdogTimeoutHuge"]),
        ("decode", {}, ("--watc", "nan"), ["SGLangWatchdogTimeoutHuge"]),  # a prefix argparse takes
        ("decode", {}, ("--watchdog-timeout", "3600"), []),
        ("decode", {}, ("--watchdog-timeout", "100000", "--watchdog-timeout", "300"), []),
        ("decode", {}, ("--soft-watchdog-timeout", "100000"), []),  # another flag
        ("decode", {}, ("--watchdog-timeout", "forever"), []),  # argparse refuses it
        # The generating /health is what a liveness probe restarts a hung scheduler by.
        ("prefill", {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}, (),
         ["SGLangHealthGenerationOff"]),
        ("decode", {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}, (),
         ["SGLangHealthGenerationOff"]),
        ("decode", {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "True"}, (), []),
        ("decode", {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "off"}, (), []),  # not a bool
        (None, {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "no"}, (),
         ["SGLangHealthGenerationOff"]),  # any server, PD or not
        ("decode", {"SGLANG_DIAG_BYPASS_HEALTH_GENERATE": "1"}, (), ["SGLangHealthBypassed"]),
        ("decode", {"SGLANG_DIAG_BYPASS_HEALTH_GENERATE": "false"}, (), []),
        # Deferred KV release keeps a prefill's late writes out of reused decode pages.
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "false"}, (),
         ["SGLangDeferredKVReleaseOff"]),
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "true"}, (), []),
        ("prefill", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "false"}, (), []),
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "false"},
         ("--disaggregation-transfer-backend", "ascend"), []),  # a backend that never defers
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "0"},
         ("--disaggregation-transfer-backend=nixl",), ["SGLangDeferredKVReleaseTimeoutShort"]),
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "5"}, (), []),
        ("decode", {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "0",
                    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "no"}, (),
         ["SGLangDeferredKVReleaseOff"]),  # the timeout does not matter then
    ],
)  # fmt: skip
def test_each_rule_fires_and_its_near_miss_does_not(
    mode: str | None, env: Env, args: tuple[str, ...], rules: list[str]
) -> None:
    assert fired(sglang_pod(*args, mode=mode, env=env)) == rules


def test_rendered_and_default_pods_get_no_advice() -> None:
    assert fired(sglang_pod()) == []
    assert fired(sglang_pod(mode="prefill")) == []
    assert fired(sglang_pod(mode=None)) == []
    spec = parse_spec({"engine": "sglang", "model": {"name": "m"}, "image": "lmsysorg/sglang:v0",
                       "prefill": {"gpus": 1}, "decode": {"gpus": 1}})  # fmt: skip
    for role in (ROLE_PREFILL, ROLE_DECODE):
        launch = ENGINE.worker_launch(spec, role, "pd")
        container = {"command": launch.command,
                     "env": [{"name": k, "value": v} for k, v in launch.env.items()]}  # fmt: skip
        assert sglang_flags.server({"spec": {"containers": [container]}}) is not None
        assert ENGINE.advisories({"spec": {"containers": [container]}}) == ()


def test_a_pod_whose_settings_cannot_be_read_gets_none() -> None:
    huge = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"}
    assert fired(sglang_pod(env=huge, command=["python3", "-m", "vllm.serve"])) == []
    assert advice.advisories({}) == ()
    assert advice.advisories({"spec": {"containers": "garbage"}}) == ()
    # The environment as a reference, not a literal: the value is not known here.
    pod = sglang_pod()
    pod["spec"]["containers"][1]["env"] = [
        {"name": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "valueFrom": {"configMapKeyRef": {}}},
        {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "$(HEALTH)"},
    ]
    assert fired(pod) == []
    # A --config file may set the flags: none is judged then (the environment still is).
    configured = sglang_pod("--config", "/etc/s.yaml", "--watchdog-timeout", "100000",
                            env={**huge, "SGLANG_DIAG_BYPASS_HEALTH_GENERATE": "y"})  # fmt: skip
    assert fired(configured) == ["SGLangHealthBypassed"]


def test_the_environment_is_read_as_the_kubelet_and_the_shell_set_it() -> None:
    pod = sglang_pod()
    pod["spec"]["containers"][1]["env"] = [
        {"name": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "value": "100000"},
        {"name": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "value": "300"},  # the later one wins
    ]
    assert fired(pod) == []
    one_liner = [
        "sh",
        "-c",
        "export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000; "
        "python3 -m sglang.launch_server --model-path m --disaggregation-mode decode",
    ]
    assert fired(sglang_pod(command=one_liner)) == ["SGLangWaitingTimeoutHuge"]
    prefixed = ["env", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false", "sglang", "serve",
                "--disaggregation-mode", "prefill"]  # fmt: skip
    assert fired(sglang_pod(command=prefixed)) == ["SGLangHealthGenerationOff"]


def test_every_rule_cites_its_source_and_one_sentence_of_risk() -> None:
    names = [r.name for r in advice.RULES]
    assert len(names) == len(set(names))
    for rule in advice.RULES:
        assert rule.name.startswith("SGLang") and rule.name.isalnum(), rule.name
        assert rule.source.startswith("srt/") and ".py:" in rule.source, rule.source
        assert rule.risk.endswith(".") and rule.risk.count(". ") == 0, rule.risk


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


def test_the_advisor_s_flag_prefixes_are_those_argparse_accepts_in_0_5_23() -> None:
    flags = _flags_of_the_real_server()
    for flag, shortest in (*sglang_flags.MODE, *sglang_flags.WATCHDOG, *advice.TRANSFER):
        assert flag in flags
        assert [f for f in flags if f.startswith(shortest)] == [flag], shortest
        assert len([f for f in flags if f.startswith(shortest[:-1])]) > 1, shortest
