"""The operator's boundary: turn a raw `spec` or `status` mapping into models, or say why not.

Why: handlers receive plain dicts from kopf. Parsing them once, here, means the rest of the
operator works with frozen, validated models, and a spec the API server should have refused (an
older CRD, a client that skipped validation) becomes one permanent error whose problems name the
field the way the API server does ("spec.remediation.wedgeAfterSeconds: ...").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from pdwarden.api.base import RULE_ERROR
from pdwarden.api.policy import PDRemediationPolicySpec
from pdwarden.api.policy_status import PDRemediationPolicyStatus
from pdwarden.api.spec import PDDeploymentSpec
from pdwarden.api.status import PDDeploymentStatus


class InvalidSpec(ValueError):
    """A PDDeployment spec that can never be reconciled as written; retrying cannot help."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def field_problems(error: ValidationError, root: str = "spec") -> list[str]:
    """One "path: message" line per pydantic error, paths in wire (camelCase) names."""
    problems = []
    for item in error.errors():
        path = root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        if item["type"] == RULE_ERROR:
            path += str((item.get("ctx") or {}).get("field_path", ""))
            message = item["msg"]
        else:
            message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{path}: {message}")
    return problems


def parse_spec(raw: Mapping[str, Any]) -> PDDeploymentSpec:
    """Validate a PDDeployment's `spec`; raise InvalidSpec with field-named problems.

    Only wire (camelCase) names are accepted, as the API server accepts only those.
    """
    try:
        return PDDeploymentSpec.model_validate(dict(raw), by_alias=True, by_name=False)
    except ValidationError as error:
        raise InvalidSpec(field_problems(error)) from None


def parse_status(raw: Mapping[str, Any] | None) -> PDDeploymentStatus:
    """Read back the status the operator wrote (an empty status when there is none yet)."""
    return PDDeploymentStatus.model_validate(dict(raw or {}), by_alias=True, by_name=False)


def spec_to_wire(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The spec as the API server stores it: camelCase keys, unset optionals left out."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_to_wire(status: PDDeploymentStatus) -> dict[str, Any]:
    """The status as a JSON-ready patch body: camelCase keys, RFC 3339 times."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def parse_policy_spec(raw: Mapping[str, Any]) -> PDRemediationPolicySpec:
    """Validate a PDRemediationPolicy's `spec`; raise InvalidSpec with field-named problems."""
    try:
        return PDRemediationPolicySpec.model_validate(dict(raw), by_alias=True, by_name=False)
    except ValidationError as error:
        raise InvalidSpec(field_problems(error)) from None


def parse_policy_status(raw: Mapping[str, Any] | None) -> PDRemediationPolicyStatus:
    """Read back the status the operator wrote on a policy (empty when there is none yet)."""
    return PDRemediationPolicyStatus.model_validate(dict(raw or {}), by_alias=True, by_name=False)


def to_wire(model: BaseModel) -> dict[str, Any]:
    """Any API model as the API server stores it: camelCase keys, unset optionals left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
