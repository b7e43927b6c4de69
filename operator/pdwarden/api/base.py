"""Shared shape of every PDDeployment model, and the cross-field rules they carry.

Why this module exists: the API server and the operator must refuse the same specs with the same
words. A `Rule` holds one cross-field check twice, once as a CEL expression that the generated CRD
hands to the API server (`x-kubernetes-validations`) and once as a Python predicate that the
pydantic models run, and a single message that names the field for both. Tests compare the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

RULE_ERROR = "pdwarden_rule"


@dataclass(frozen=True)
class Rule:
    """One cross-field check, evaluated with `self` bound to the model that declares it."""

    cel: str
    message: str
    # Path of the offending field relative to the owning object, as the API server reports it
    # (".wedgeAfterSeconds"); "" when the object as a whole is at fault.
    field_path: str
    check: Callable[[Any], bool]

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _add_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_schema() for r in rules]


class ApiModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields and coercions refused.

    `strict` matches the API server: "1" is not an integer and 1 is not a string.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
        json_schema_extra=_add_rules,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in self.RULES:
            if not rule.check(self):
                raise PydanticCustomError(RULE_ERROR, rule.message, {"field_path": rule.field_path})
        return self


class StatusModel(BaseModel):
    """Base of the status models: same wire names, but lenient about input types.

    Status is written by the operator and read back through kopf as plain JSON, so timestamps
    arrive as strings; unknown fields are still refused so the schema stays the whole truth.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def nested(factory: Callable[[], BaseModel], description: str | None = None) -> Any:
    """A sub-object that is always present, defaulting to the sub-model's own defaults.

    The CRD default is the whole defaulted object, not `{}`: the API server checks a default
    against the CEL rules without filling in the nested defaults first. Without a `description`
    the sub-model's docstring describes the field (`kubectl explain`).
    """
    wire = factory().model_dump(mode="json", by_alias=True, exclude_none=True)
    return Field(
        default_factory=factory,
        description=description,
        json_schema_extra={"default": prune_empty(wire)},
    )


def prune_empty(value: Any) -> Any:
    """Drop empty lists and maps, which the API server does not store for unset fields."""
    if isinstance(value, dict):
        pruned = {k: prune_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [prune_empty(v) for v in value]
    return value
