"""Equality-based label selectors, parsed once and matched in memory.

Why: the watch cache (`k8s.cache`) answers the shells' `list(kind, namespace, selector)` calls
from memory, so it must agree with the API server on what a selector matches. Only the
equality-based forms the operator itself writes are parsed (`k=v`, `k==v`, `k!=v`, `k`, `!k`,
comma-separated); a set-based selector (`k in (a,b)`) or anything malformed parses to None and
the caller asks the API server instead, which is always right.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# A label key: optional DNS prefix, then a name (kubernetes.io "Syntax and character set").
_KEY: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE: Final = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
MAX_SELECTOR: Final = 4096


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        # "!=": as the API server reads it, a missing label is "not equal" too.
        return labels.get(self.key) != self.value


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        return all(r.matches(have) for r in self.requirements)

    def equals(self, key: str) -> str | None:
        """The value this selector requires `key` to have (`key=value`), if it does."""
        return next((r.value for r in self.requirements if r.key == key and r.op == "="), None)


def parse(selector: str) -> Selector | None:
    """The selector, or None if it is not one this module can match exactly."""
    if len(selector) > MAX_SELECTOR or "(" in selector:
        return None
    out = []
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            if raw or selector.strip():
                return None  # an empty term between commas
            continue
        req = _term(term)
        if req is None:
            return None
        out.append(req)
    return Selector(tuple(out))


def _term(term: str) -> Requirement | None:
    for op, spelled in (("!=", "!="), ("=", "=="), ("=", "=")):
        if spelled in term:
            key, _, value = term.partition(spelled)
            key, value = key.strip(), value.strip()
            if not _KEY.match(key) or not _VALUE.match(value):
                return None
            return Requirement(key, op, value)
    if term.startswith("!"):
        key = term[1:].strip()
        return Requirement(key, "!exists") if _KEY.match(key) else None
    return Requirement(term, "exists") if _KEY.match(term) else None
