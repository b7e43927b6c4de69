"""The Kubernetes label selector (metav1.LabelSelector), typed and bounded, and how it matches.

Why here and not the upstream type: a PDRemediationPolicy picks pods that pdwarden did not create,
so its selectors are the one thing standing between pdwarden and every pod in the namespace. They
are refused at the door when empty or malformed (an empty selector matches everything), and the
matching rules live next to the model, pure, so the operator and the tests agree with the API
server's semantics (k8s.io/apimachinery/pkg/labels: matchLabels AND every requirement).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from pdwarden.api.base import ApiModel, Rule

# k8s.io/apimachinery/pkg/util/validation: a qualified name with an optional DNS-subdomain prefix.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_KEY = re.compile(LABEL_KEY_PATTERN)
MAX_KEY = 317  # 253 prefix + "/" + 63 name
MAX_LABEL_VALUE = 63
MAX_MATCH_LABELS = 32
MAX_EXPRESSIONS = 16
MAX_VALUES = 32

LabelKey = Annotated[str, Field(min_length=1, max_length=MAX_KEY, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_PATTERN)]
Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


def _key_problem(key: str) -> str | None:
    if len(key) > MAX_KEY or not _KEY.match(key):
        return f"{key!r} is not a label key (an optional DNS prefix and '/', then a name)"
    name = key.rsplit("/", 1)[-1]
    if len(name) > MAX_LABEL_VALUE:
        return f"{key!r}: the name part of a label key is at most {MAX_LABEL_VALUE} characters"
    return None


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector: key, operator and (for In and NotIn) values."""

    key: LabelKey = Field(description="Label key the requirement applies to.")
    operator: Operator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=MAX_VALUES,
        description="Values for In and NotIn (at least one); empty for Exists and DoesNotExist.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "self.operator in ['Exists', 'DoesNotExist'] "
                "? (!has(self.values) || size(self.values) == 0) "
                ": (has(self.values) && size(self.values) > 0)"
            ),
            message="values must be non-empty for In and NotIn, and empty for Exists and "
            "DoesNotExist",
            field_path=".values",
            check=lambda s: (len(s.values) == 0) == (s.operator in ("Exists", "DoesNotExist")),
        ),
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # NotIn


class LabelSelector(ApiModel):
    """Which pods: all matchLabels and every matchExpressions requirement must hold.

    At least one of the two must be non-empty: an empty selector would match every pod in the
    namespace, which is never what a remediation policy means.
    """

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_MATCH_LABELS,
        description="Labels the pod must carry with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        max_length=MAX_EXPRESSIONS,
        description="Requirements the pod's labels must meet, all of them.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)"
            ),
            message=(
                "a selector needs at least one matchLabels entry or matchExpressions requirement: "
                "an empty selector matches every pod in the namespace"
            ),
            field_path="",
            check=lambda s: bool(s.match_labels or s.match_expressions),
        ),
    )

    @field_validator("match_labels")
    @classmethod
    def _keys_are_label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        # The CRD cannot check map keys cheaply (no propertyNames in structural schemas); the
        # operator does, before the selector is ever used.
        for key in labels:
            problem = _key_problem(key)
            if problem:
                raise ValueError(problem)
        return labels

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a pod with these labels is selected (the API server's semantics)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(r.matches(labels) for r in self.match_expressions)

    def to_query(self) -> str:
        """The selector as a `labelSelector` query string, for server-side filtering of lists."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for r in self.match_expressions:
            if r.operator == "Exists":
                parts.append(r.key)
            elif r.operator == "DoesNotExist":
                parts.append(f"!{r.key}")
            else:
                op = "in" if r.operator == "In" else "notin"
                parts.append(f"{r.key} {op} ({','.join(sorted(r.values))})")
        return ",".join(parts)
