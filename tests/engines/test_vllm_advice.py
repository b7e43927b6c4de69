"""vLLM settings that switch vLLM's own safety nets off: each rule fires, and a near miss does not.

The rules (operator/pdwarden/engines/vllm_advice.py) read the pod's `vllm serve` command line as
vLLM 0.32's FlexibleArgumentParser reads it and its literal environment; a pod whose settings
cannot be read is never flagged, and neither is a pod pdwarden renders itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdwarden.api import parse_spec
from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL
from pdwarden.engines import vllm_advice as advice
from pdwarden.engines.vllm import ENGINE


def kv(role: str = "kv_producer", connector: str = "NixlConnector", **extra: Any) -> str:
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


def vllm_pod(*args: str, env: dict[str, str] | None = None,
             command: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    container = {
        "name": "vllm",
        "command": ["vllm", "serve", "m"] if command is None else command,
        "args": list(args),
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    return {"metadata": {"name": "p-0", "uid": "uid-p-0"}, "spec": {"containers": [container]}}


def fired(pod: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a.rule.name, a.value) for a in advice.advisories(pod)]


@pytest.mark.parametrize(
    ("args", "env", "rules"),
    [
        # The lease: what frees a prefill's blocks, renewed by decode heartbeats.
        (("--kv-transfer-config", kv(kv_lease_duration=5)), {}, [("VLLMKVLeaseShort", "5 s")]),
        (("--kv-transfer-config", kv(kv_lease_duration=6)), {}, []),  # near miss
        (("--kv-transfer-config", kv(kv_lease_duration=0.5)), {}, [("VLLMKVLeaseShort", "0.5 s")]),
        (("--kv-transfer-config", kv("kv_both", kv_lease_duration=2)), {},
         [("VLLMKVLeaseShort", "2 s")]),
        (("--kv-transfer-config", kv("kv_consumer", kv_lease_duration=2)), {}, []),  # renews only
        (("--kv-transfer-config", kv(kv_lease_duration=100000)), {},
         [("VLLMKVLeaseHuge", "100000 s")]),
        (("--kv-transfer-config", kv(kv_lease_duration=3600)), {}, []),  # near miss
        (("--kv-transfer-config", kv(kv_lease_duration="5")), {}, []),  # vLLM fails at start-up
        (("--kv-transfer-config", kv(kv_lease_duration=True)), {}, []),
        (("--kv-transfer-config", kv(connector="LMCacheConnectorV1", kv_lease_duration=1)),
         {}, []),  # only the NixlConnector leases
        (("--kv-transfer-config", kv()), {}, []),  # the default, 30 s
        (("--kv-transfer-config", "{not json"), {}, []),
        # Underscores, `=`, the last occurrence, dotted keys replacing a whole earlier JSON.
        (("--kv_transfer_config=" + kv(kv_lease_duration=1),), {}, [("VLLMKVLeaseShort", "1 s")]),
        (("--kv-transfer-config", kv(kv_lease_duration=1), "--kv-transfer-config", kv()), {}, []),
        (("--kv-transfer-config", kv(kv_lease_duration=30),
          "--kv-transfer-config.kv_connector", "NixlConnector",
          "--kv-transfer-config.kv_role=kv_producer",
          "--kv-transfer-config.kv_connector_extra_config.kv_lease_duration", "3"), {},
         [("VLLMKVLeaseShort", "3 s")]),
        (("--kv-transfer-config", kv(kv_lease_duration=3),
          "--kv-transfer-config.kv_connector_extra_config.kv_lease_duration", "3"), {},
         []),  # the dotted JSON alone is what vLLM keeps: no connector, no lease
        (("--kv-transfer-config", kv(kv_lease_duration=3), "--config", "/etc/v.yaml"), {}, []),
        (("--kv-transfer-c", kv(kv_lease_duration=3)), {}, []),  # an abbreviation: not read
        # The executor's step timeout turns a hung TP worker into a failed engine.
        ((), {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "100000"},
         [("VLLMExecuteModelTimeoutHuge", "100000")]),
        ((), {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}, []),
        ((), {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1e9"}, []),  # vLLM fails at start-up
        # A key refuses pdwarden's canaries (HTTP 401); the key itself is never shown.
        (("--api-key", "s3cret"), {}, [("VLLMAPIKeyRefusesCanaries", "set")]),
        (("--api_key=s3cret",), {}, [("VLLMAPIKeyRefusesCanaries", "set")]),
        ((), {"VLLM_API_KEY": "s3cret"}, [("VLLMAPIKeyRefusesCanaries", "set")]),
        ((), {"VLLM_API_KEY": ""}, []),  # vLLM ignores an empty key
        (("--api-keys", "x"), {}, []),  # another flag
        # Gone in 0.32 (the lease replaced it): nothing to warn of.
        ((), {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "1"}, []),
        (("--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector",
                                              "kv_role": "kv_consumer",
                                              "kv_load_failure_policy": "recompute"})), {}, []),
    ],
)  # fmt: skip
def test_each_rule_fires_and_its_near_miss_does_not(
    args: tuple[str, ...], env: dict[str, str], rules: list[tuple[str, str]]
) -> None:
    assert fired(vllm_pod(*args, env=env)) == rules


def test_other_command_lines_and_unreadable_pods_get_none() -> None:
    short = ("--kv-transfer-config", kv(kv_lease_duration=1))
    assert fired(
        vllm_pod(
            *short, command=["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
        )
    ) == [("VLLMKVLeaseShort", "1 s")]
    assert fired(vllm_pod(*short, command=["python3", "-m", "sglang.launch_server"])) == []
    # A shell's script is split as the shell splits it; a list item with spaces is one argument.
    script = f"exec vllm serve m --kv-transfer-config '{kv(kv_lease_duration=2)}'"
    assert fired(vllm_pod(command=["/bin/bash", "-lc", script])) == [("VLLMKVLeaseShort", "2 s")]
    assert fired(vllm_pod(command=["vllm", "serve", script])) == []
    assert advice.advisories({}) == ()
    assert advice.advisories({"spec": {"containers": [None, {"command": 7}]}}) == ()
    huge = vllm_pod(env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "100000"})
    huge["spec"]["containers"][0]["env"] = [
        {"name": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "valueFrom": {"fieldRef": {}}}
    ]
    assert fired(huge) == []


@pytest.mark.parametrize("lease", [None, 6, 3600])
@pytest.mark.parametrize("role", [ROLE_PREFILL, ROLE_DECODE])
def test_pods_pdwarden_renders_get_no_advice(lease: int | None, role: str) -> None:
    spec = parse_spec({"engine": "vllm", "model": {"name": "m"}, "image": "vllm/vllm-openai:v0",
                       "vllm": {"kvLeaseSeconds": lease}})  # fmt: skip
    launch = ENGINE.worker_launch(spec, role, "pd")
    container = {"command": launch.command,
                 "env": [{"name": k, "value": v} for k, v in launch.env.items()]}  # fmt: skip
    assert ENGINE.advisories({"spec": {"containers": [container]}}) == ()


def test_every_rule_cites_its_source_and_one_sentence_of_risk() -> None:
    names = [r.name for r in advice.RULES]
    assert len(names) == len(set(names))
    for rule in advice.RULES:
        assert rule.name.startswith("VLLM") and rule.name.isalnum(), rule.name
        assert ".py:" in rule.source, rule.source
        assert rule.risk.endswith(".") and rule.risk.count(". ") == 0, rule.risk


def test_a_key_from_a_secret_is_seen_and_its_value_never_read() -> None:
    pod = vllm_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "key"}}}
    ]
    assert fired(pod) == [("VLLMAPIKeyRefusesCanaries", "set")]
    shell = vllm_pod(command=["sh", "-c", "VLLM_API_KEY=$KEY vllm serve m"])
    assert fired(shell) == [("VLLMAPIKeyRefusesCanaries", "set")]
