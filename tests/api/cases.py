"""Specs the API server and the pydantic models must both refuse, with the field each names.

One table serves two test files: test_api_rules.py checks the pydantic side without Kubernetes,
test_crd_apiserver.py sends the same specs to a real kube-apiserver. Each case is a patch over a
valid minimal spec, so a case fails for exactly one reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALL_EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
# PDRemediationPolicy examples are named policy-*.yaml (tested in test_policy_api.py).
EXAMPLES = [p for p in ALL_EXAMPLES if not p.name.startswith("policy-")]
POLICY_EXAMPLES = [p for p in ALL_EXAMPLES if p.name.startswith("policy-")]
CRD_FILE = ROOT / "crds" / "pddeployments.pdwarden.dev.yaml"
POLICY_CRD_FILE = ROOT / "crds" / "pdremediationpolicies.pdwarden.dev.yaml"
DELETE = object()  # marks a key to remove in a patch

BASE_SPEC: dict[str, Any] = {
    "image": "pdwarden/pdworker:dev",
    "model": {"name": "tiny"},
    "prefill": {"replicas": 1, "gpus": 0},
    "decode": {"replicas": 2, "gpus": 0},
}


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A deep merge of `patch` into a copy of `base`; DELETE removes a key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Bad:
    id: str
    patch: dict[str, Any]
    field: str  # the path the refusal must name, as the API server spells it

    @property
    def spec(self) -> dict[str, Any]:
        return merged(BASE_SPEC, self.patch)


BAD_SPECS: list[Bad] = [
    Bad("replicas-negative", {"decode": {"replicas": -1}}, "spec.decode.replicas"),
    Bad("replicas-absurd", {"prefill": {"replicas": 100000}}, "spec.prefill.replicas"),
    Bad("replicas-string", {"decode": {"replicas": "2"}}, "spec.decode.replicas"),
    Bad("router-replicas-float", {"router": {"replicas": 1.5}}, "spec.router.replicas"),
    Bad("gpus-string", {"prefill": {"gpus": "1"}}, "spec.prefill.gpus"),
    Bad("gpus-absurd", {"decode": {"gpus": 64}}, "spec.decode.gpus"),
    Bad("engine-unknown", {"engine": "tensorrt-llm"}, "spec.engine"),
    Bad("model-missing", {"model": DELETE}, "spec.model"),
    Bad("model-wrong-type", {"model": "tiny"}, "spec.model"),
    Bad("action-unknown", {"remediation": {"actions": ["FailRooms", "Reboot"]}},
        "spec.remediation.actions[1]"),
    Bad("action-repeated", {"remediation": {"actions": ["FailRooms", "FailRooms"]}},
        "spec.remediation.actions"),
    Bad("restart-without-cordon", {"remediation": {"actions": ["FailRooms", "RestartDecode"]}},
        "spec.remediation.actions"),
    Bad("restart-prefill-without-abort",
        {"remediation": {"actions": ["CordonDecode", "RestartPrefill"]}},
        "spec.remediation.actions"),
    Bad("mode-unknown", {"remediation": {"mode": "Auto"}}, "spec.remediation.mode"),
    Bad("wedge-equals-scrape",
        {"remediation": {"scrapeIntervalSeconds": 10, "wedgeAfterSeconds": 10}},
        "spec.remediation.wedgeAfterSeconds"),
    Bad("wedge-below-scrape",
        {"remediation": {"scrapeIntervalSeconds": 30, "wedgeAfterSeconds": 20}},
        "spec.remediation.wedgeAfterSeconds"),
    Bad("restart-before-scrape",
        {"remediation": {"scrapeIntervalSeconds": 10, "restartAfterSeconds": 5}},
        "spec.remediation.restartAfterSeconds"),
    Bad("scrape-zero", {"remediation": {"scrapeIntervalSeconds": 0}},
        "spec.remediation.scrapeIntervalSeconds"),
    Bad("budget-100-percent", {"remediation": {"maxUnavailableDecode": "100%"}},
        "spec.remediation.maxUnavailableDecode"),
    Bad("budget-not-a-percent", {"remediation": {"maxUnavailableDecode": "half"}},
        "spec.remediation.maxUnavailableDecode"),
    Bad("budget-negative", {"remediation": {"maxUnavailableDecode": -1}},
        "spec.remediation.maxUnavailableDecode"),
    Bad("breaker-zero", {"remediation": {"maxActionsPerHour": 0}},
        "spec.remediation.maxActionsPerHour"),
    Bad("sglang-without-image", {"engine": "sglang", "image": DELETE,
                                 "prefill": {"gpus": 1}, "decode": {"gpus": 1}}, "spec.image"),
    Bad("sglang-on-cpu", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                          "decode": {"gpus": 1}}, "spec.prefill.gpus"),
    Bad("sglang-on-cpu-other-device", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                                       "prefill": {"gpus": 1},
                                       "decode": {"args": ["--device", "cpux"]}},
        "spec.decode.gpus"),
    Bad("sglang-tp-size-in-args", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                                   "prefill": {"gpus": 2, "args": ["--tp-size", "2"]},
                                   "decode": {"gpus": 1}}, "spec.prefill.args"),
    Bad("sglang-model-alias-in-args", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                                       "prefill": {"gpus": 1, "args": ["--model", "other/m"]},
                                       "decode": {"gpus": 1}}, "spec.prefill.args"),
    Bad("sglang-model-alias-with-equals", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                                           "prefill": {"gpus": 1},
                                           "decode": {"gpus": 1, "args": ["--model=other/m"]}},
        "spec.decode.args"),
    Bad("sglang-port-in-args", {"engine": "sglang", "image": "lmsysorg/sglang:latest",
                                "prefill": {"gpus": 1},
                                "decode": {"gpus": 1, "args": ["--port=9000"]}},
        "spec.decode.args"),
    Bad("sglang-shm-garbage", {"sglang": {"shmSize": "lots"}}, "spec.sglang.shmSize"),
    Bad("sglang-startup-too-short", {"sglang": {"startupTimeoutSeconds": 10}},
        "spec.sglang.startupTimeoutSeconds"),
    Bad("sglang-claim-bad-name", {"sglang": {"cache": {"persistentVolumeClaim": "Not_A_Name"}}},
        "spec.sglang.cache.persistentVolumeClaim"),
    Bad("vllm-without-image", {"engine": "vllm", "image": DELETE}, "spec.image"),
    Bad("vllm-kv-config-in-args", {"engine": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                   "prefill": {"args": ["--kv-transfer-config", "{}"]}},
        "spec.prefill.args"),
    Bad("vllm-no-stats", {"engine": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                          "decode": {"args": ["--disable-log-stats"]}}, "spec.decode.args"),
    Bad("vllm-port-in-args", {"engine": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                              "decode": {"args": ["--port=9000"]}}, "spec.decode.args"),
    Bad("vllm-buffer-device-unknown", {"vllm": {"kvBufferDevice": "tpu"}},
        "spec.vllm.kvBufferDevice"),
    Bad("vllm-lease-under-heartbeat", {"vllm": {"kvLeaseSeconds": 5}}, "spec.vllm.kvLeaseSeconds"),
    Bad("decode-zero-while-restarting", {"decode": {"replicas": 0}}, "spec.decode.replicas"),
    Bad("bootstrap-port-privileged", {"transfer": {"bootstrapPort": 80}},
        "spec.transfer.bootstrapPort"),
    Bad("nixl-backend-unknown", {"transfer": {"nixlBackend": "TCP"}},
        "spec.transfer.nixlBackend"),
    Bad("reserved-label", {"prefill": {"labels": {"pdwarden.dev/role": "x"}}},
        "spec.prefill.labels"),
    Bad("gpu-in-resources", {"decode": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
        "spec.decode.resources"),
    Bad("quantity-garbage", {"prefill": {"resources": {"requests": {"cpu": "lots"}}}},
        "spec.prefill.resources.requests.cpu"),
    Bad("env-value-and-value-from",
        {"prefill": {"env": [{"name": "A", "value": "1",
                              "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}},
        "spec.prefill.env[0].valueFrom"),
    Bad("env-duplicate-name",
        {"decode": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
        "spec.decode.env"),
    Bad("allow-from-empty-peer", {"network": {"allowFrom": [{}]}}, "spec.network.allowFrom[0]"),
    Bad("allow-from-every-namespace", {"network": {"allowFrom": [{"namespaceSelector": {}}]}},
        "spec.network.allowFrom[0].namespaceSelector"),
    Bad("allow-from-whole-namespace", {"network": {"allowFrom": [{"podSelector": {}}]}},
        "spec.network.allowFrom[0].podSelector"),
    Bad("allow-from-bad-operator",
        {"network": {"allowFrom": [{"podSelector": {"matchExpressions": [
            {"key": "app", "operator": "Equals", "values": ["gw"]}]}}]}},
        "spec.network.allowFrom[0].podSelector.matchExpressions[0].operator"),
    Bad("allow-from-in-without-values",
        {"network": {"allowFrom": [{"namespaceSelector": {"matchExpressions": [
            {"key": "team", "operator": "In"}]}}]}},
        "spec.network.allowFrom[0].namespaceSelector.matchExpressions[0].values"),
    Bad("allow-from-too-many",
        {"network": {"allowFrom": [{"podSelector": {"matchLabels": {"app": f"gw{i}"}}}
                                   for i in range(17)]}},
        "spec.network.allowFrom"),
    Bad("allow-from-typo", {"network": {"allowFrom": [{"podSelectors": {}}]}},
        "spec.network.allowFrom[0].podSelectors"),
    Bad("unknown-field-top", {"replicas": 3}, "spec.replicas"),
    Bad("unknown-field-typo", {"remediation": {"wedgeAfter": 30}}, "spec.remediation.wedgeAfter"),
]  # fmt: skip


def load_examples() -> dict[str, dict[str, Any]]:
    """Every PDDeployment example manifest by file name."""
    return {p.name: yaml.safe_load(p.read_text()) for p in EXAMPLES}


def load_policy_examples() -> dict[str, dict[str, Any]]:
    """Every PDRemediationPolicy example manifest by file name."""
    return {p.name: yaml.safe_load(p.read_text()) for p in POLICY_EXAMPLES}
