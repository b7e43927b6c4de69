"""Small, well-typed subsets of core/v1 types that a PDDeployment passes through to its pods.

Why not the full upstream schemas: a PDDeployment should be refused at the door when it is wrong,
so the fields users commonly set (env, tolerations, resources) are typed here with the limits the
API server needs to cost CEL rules. `affinity` is the one exception: the upstream type is large and
deeply nested, so it is an opaque object (`x-kubernetes-preserve-unknown-fields`) copied verbatim
into the pod template; the API server validates it when the operator writes the StatefulSet, and
the operator reports a refusal there as a Degraded condition.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, WithJsonSchema

from pdwarden.api.base import ApiModel, Rule

# resource.Quantity's serialized form (k8s.io/apimachinery/pkg/api/resource).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)
MAX_MAP_ENTRIES = 64
MAX_LIST_ITEMS = 64
MAX_NAME = 253
MAX_VALUE = 4096


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 500m, 2Gi or 4")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "description": "A Kubernetes quantity, such as 500m, 2Gi or 4.",
        }
    ),
]

StringMap = Annotated[
    dict[str, Annotated[str, Field(max_length=MAX_VALUE)]], Field(max_length=MAX_MAP_ENTRIES)
]

Affinity = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap in the PDDeployment's namespace."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the object.")
    key: str = Field(min_length=1, max_length=MAX_NAME, description="Key inside the object.")
    optional: bool | None = Field(None, description="Start the pod even if the key is missing.")


class FieldRef(ApiModel):
    """A field of the pod itself, for example status.podIP or metadata.name."""

    field_path: str = Field(min_length=1, max_length=MAX_NAME, description="Path of the field.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from; set exactly one source."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(None, description="A field of the pod.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)]"
            ".filter(x, x).size() == 1",
            message="valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef",
            field_path="",
            check=lambda s: (
                sum(x is not None for x in (s.secret_key_ref, s.config_map_key_ref, s.field_ref))
                == 1
            ),
        ),
    )


class EnvVar(ApiModel):
    """An environment variable of the role's container."""

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name.",
    )
    value: str | None = Field(None, max_length=32768, description="Literal value.")
    value_from: EnvVarSource | None = Field(None, description="Take the value from elsewhere.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            field_path=".valueFrom",
            check=lambda s: not (s.value is not None and s.value_from is not None),
        ),
    )


class Toleration(ApiModel):
    """A taint the role's pods tolerate (core/v1 Toleration)."""

    key: str | None = Field(None, max_length=316, description="Taint key; empty matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(
        None, description="Exists or Equal (the Kubernetes default)."
    )
    value: str | None = Field(None, max_length=MAX_NAME, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="For NoExecute: how long the pod stays bound after the taint."
    )


class Resources(ApiModel):
    """CPU, memory and other resources of the role's main container (core/v1 shape).

    GPUs are requested with the pool's `gpus` field, not here.
    """

    requests: dict[str, Quantity] | None = Field(
        None, max_length=16, description="Minimum resources the scheduler reserves."
    )
    limits: dict[str, Quantity] | None = Field(
        None, max_length=16, description="Maximum resources the container may use."
    )
