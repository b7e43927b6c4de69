"""PDRemediationPolicy specs that the API server and the models must both refuse, and the field.

Like cases.py: one table for the pydantic side (test_policy_api.py) and the real API server
(test_policy_apiserver.py); each case is one patch over a valid minimal policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cases import DELETE, merged

BASE_POLICY: dict[str, Any] = {
    "engine": "sglang",
    "prefillSelector": {"matchLabels": {"app": "sglang", "role": "prefill"}},
    "decodeSelector": {"matchLabels": {"app": "sglang", "role": "decode"}},
    "metrics": {"port": 30000},
}


@dataclass(frozen=True)
class BadPolicy:
    id: str
    patch: dict[str, Any]
    field: str

    @property
    def spec(self) -> dict[str, Any]:
        return merged(BASE_POLICY, self.patch)


BAD_POLICIES: list[BadPolicy] = [
    BadPolicy("engine-missing", {"engine": DELETE}, "spec.engine"),
    BadPolicy("engine-unknown", {"engine": "tensorrt-llm"}, "spec.engine"),
    BadPolicy("prefill-selector-missing", {"prefillSelector": DELETE}, "spec.prefillSelector"),
    BadPolicy("decode-selector-empty", {"decodeSelector": {"matchLabels": DELETE}},
              "spec.decodeSelector"),
    BadPolicy("decode-selector-empty-list",
              {"decodeSelector": {"matchLabels": DELETE, "matchExpressions": []}},
              "spec.decodeSelector"),
    BadPolicy("same-selectors", {"decodeSelector": {"matchLabels": {"role": "prefill"}}},
              "spec.decodeSelector"),
    BadPolicy("label-value-too-long",
              {"prefillSelector": {"matchLabels": {"role": "p" * 64}}},
              "spec.prefillSelector.matchLabels.role"),
    BadPolicy("label-value-bad-chars",
              {"prefillSelector": {"matchLabels": {"role": "pre fill"}}},
              "spec.prefillSelector.matchLabels.role"),
    BadPolicy("expression-operator-unknown",
              {"decodeSelector": {"matchExpressions": [
                  {"key": "tier", "operator": "Equals", "values": ["a"]}]}},
              "spec.decodeSelector.matchExpressions[0].operator"),
    BadPolicy("expression-in-without-values",
              {"decodeSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}},
              "spec.decodeSelector.matchExpressions[0].values"),
    BadPolicy("expression-exists-with-values",
              {"decodeSelector": {"matchExpressions": [
                  {"key": "tier", "operator": "Exists", "values": ["a"]}]}},
              "spec.decodeSelector.matchExpressions[0].values"),
    BadPolicy("expression-bad-key",
              {"decodeSelector": {"matchExpressions": [
                  {"key": "-bad-", "operator": "Exists"}]}},
              "spec.decodeSelector.matchExpressions[0].key"),
    BadPolicy("metrics-missing", {"metrics": DELETE}, "spec.metrics"),
    BadPolicy("port-zero", {"metrics": {"port": 0}}, "spec.metrics.port"),
    BadPolicy("port-too-big", {"metrics": {"port": 70000}}, "spec.metrics.port"),
    BadPolicy("port-string", {"metrics": {"port": "30000"}}, "spec.metrics.port"),
    BadPolicy("path-relative", {"metrics": {"path": "metrics"}}, "spec.metrics.path"),
    BadPolicy("scheme-unknown", {"metrics": {"scheme": "grpc"}}, "spec.metrics.scheme"),
    BadPolicy("restart-prefill-without-abort",
              {"remediation": {"actions": ["CordonDecode", "RestartPrefill"]}},
              "spec.remediation.actions"),
    BadPolicy("mode-unknown", {"remediation": {"mode": "Auto"}}, "spec.remediation.mode"),
    BadPolicy("restart-without-cordon",
              {"remediation": {"actions": ["FailRooms", "RestartDecode"]}},
              "spec.remediation.actions"),
    BadPolicy("budget-100-percent", {"remediation": {"maxUnavailableDecode": "100%"}},
              "spec.remediation.maxUnavailableDecode"),
    BadPolicy("wedge-below-scrape",
              {"remediation": {"scrapeIntervalSeconds": 30, "wedgeAfterSeconds": 20}},
              "spec.remediation.wedgeAfterSeconds"),
    BadPolicy("cordon-values-equal", {"cordon": {"cordonedValue": "true"}},
              "spec.cordon.cordonedValue"),
    BadPolicy("cordon-value-empty", {"cordon": {"cordonedValue": ""}},
              "spec.cordon.cordonedValue"),
    BadPolicy("service-ref-bad-name", {"cordon": {"serviceRef": {"name": "My_Service"}}},
              "spec.cordon.serviceRef.name"),
    BadPolicy("secret-ref-without-key", {"adminTokenSecretRef": {"name": "tok"}},
              "spec.adminTokenSecretRef.key"),
    BadPolicy("unknown-field", {"replicas": 2}, "spec.replicas"),
    BadPolicy("unknown-field-typo", {"decodeSelector": {"matchLabel": {"a": "b"}}},
              "spec.decodeSelector.matchLabel"),
]  # fmt: skip
