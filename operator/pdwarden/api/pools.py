"""Per-role pod settings: the prefill and decode worker pools and the router.

Why a module of its own: the three roles share every scheduling knob (resources, env, node
selection, extra labels) but differ in what they scale and whether they hold GPUs, and the render
code reads these models to build one StatefulSet or Deployment per role.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, field_validator

from pdwarden.api.base import ApiModel, Rule
from pdwarden.api.kube import (
    MAX_LIST_ITEMS,
    MAX_NAME,
    MAX_VALUE,
    Affinity,
    EnvVar,
    Resources,
    StringMap,
    Toleration,
)
from pdwarden.constants import GROUP

GPU_RESOURCE = "nvidia.com/gpu"
MAX_POOL_REPLICAS = 512
MAX_ROUTER_REPLICAS = 64
MAX_GPUS_PER_POD = 16
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
RESERVED_PREFIX = f"{GROUP}/"

_RESERVED_KEYS = Rule(
    cel=f"!has(self.labels) || self.labels.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
    message=f"label keys under {RESERVED_PREFIX} are reserved for the operator",
    field_path=".labels",
    check=lambda s: not any(k.startswith(RESERVED_PREFIX) for k in s.labels),
)
_RESERVED_ANNOTATIONS = Rule(
    cel=f"!has(self.annotations) || self.annotations.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
    message=f"annotation keys under {RESERVED_PREFIX} are reserved for the operator",
    field_path=".annotations",
    check=lambda s: not any(k.startswith(RESERVED_PREFIX) for k in s.annotations),
)
_GPUS_NOT_IN_RESOURCES = Rule(
    cel=(
        "!has(self.resources) || "
        f"((!has(self.resources.limits) || !('{GPU_RESOURCE}' in self.resources.limits)) && "
        f"(!has(self.resources.requests) || !('{GPU_RESOURCE}' in self.resources.requests)))"
    ),
    message=f"request GPUs with the gpus field, not with resources {GPU_RESOURCE}",
    field_path=".resources",
    check=lambda s: (
        s.resources is None
        or GPU_RESOURCE not in (s.resources.limits or {}) | (s.resources.requests or {})
    ),
)


class PodSettings(ApiModel):
    """Scheduling and container settings shared by every role."""

    resources: Resources | None = Field(
        None, description="CPU and memory requests and limits of the main container."
    )
    args: list[Annotated[str, Field(max_length=MAX_VALUE)]] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description=(
            "Extra command-line arguments appended after the ones the operator sets "
            "(for sglang: stock SGLang flags such as --tp-size 2)."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Extra environment variables of the main container, unique by name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_selector: StringMap = Field(
        default_factory=dict, description="Node labels the role's pods must be scheduled on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints the role's pods tolerate."
    )
    affinity: Affinity | None = Field(
        None,
        description=(
            "A core/v1 Affinity copied verbatim into the pod template; the API server checks it "
            "when the operator creates the pods' workload."
        ),
    )
    priority_class_name: str | None = Field(
        None,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN,
        description="PriorityClass of the role's pods.",
    )
    labels: StringMap = Field(
        default_factory=dict,
        description=f"Extra labels on the role's pods; keys under {RESERVED_PREFIX} are reserved.",
    )
    annotations: StringMap = Field(
        default_factory=dict,
        description=(
            f"Extra annotations on the role's pods; keys under {RESERVED_PREFIX} are reserved."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (_RESERVED_KEYS, _RESERVED_ANNOTATIONS)

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        names = [e.name for e in env]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate env names: {', '.join(duplicates)}")
        return env


class WorkerPoolSpec(PodSettings):
    """A pool of prefill or decode workers: one StatefulSet, one pod per replica."""

    replicas: int = Field(
        1, ge=0, le=MAX_POOL_REPLICAS, description="Number of worker pods in the pool."
    )
    gpus: int = Field(
        1,
        ge=0,
        le=MAX_GPUS_PER_POD,
        description=(
            f"GPUs per pod, requested as {GPU_RESOURCE}. 0 runs the worker on CPU "
            "(pdworker only; useful for local clusters and tests)."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (*PodSettings.RULES, _GPUS_NOT_IN_RESOURCES)


class RouterSpec(PodSettings):
    """The router that pairs each request with one prefill and one decode worker."""

    replicas: int = Field(
        1, ge=0, le=MAX_ROUTER_REPLICAS, description="Number of router pods; 0 runs no router."
    )
