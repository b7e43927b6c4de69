"""Turn a pydantic JSON Schema into a Kubernetes structural OpenAPI v3 schema.

Why a translation step: pydantic emits JSON Schema 2020-12 (`$ref`/`$defs`, `anyOf` with `null` for
optional fields, `const`, `title`, `additionalProperties: false` for forbidden extras), while the
API server accepts only structural schemas: every node typed, no references, no `anyOf` that
carries types, `nullable` instead of null branches. This module inlines and rewrites, and refuses
anything it cannot express faithfully rather than emitting a schema the API server would reject.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]
_DROPPED = frozenset({"title"})
_UNSUPPORTED = frozenset({"oneOf", "allOf", "not", "$ref", "const", "prefixItems", "$defs"})


class SchemaError(ValueError):
    """The models use a construct that has no structural equivalent."""


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model`, with its wire (alias) names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Schema] = raw.pop("$defs", {})
    return _rewrite(raw, defs, path=model.__name__)


def _describe(node: Schema) -> str:
    """One paragraph per docstring paragraph (kubectl explain rewraps lines), plus the default.

    `kubectl explain` does not print defaults, so a scalar or list default is written into the
    description, where users look for it.
    """
    paragraphs = re.split(r"\n\s*\n", node.get("description", "").strip())
    text = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    default = node.get("default")
    if isinstance(default, bool):
        text += f" Default: {str(default).lower()}."
    elif isinstance(default, int | float | str) or (
        isinstance(default, list) and default and all(isinstance(v, str) for v in default)
    ):
        shown = ", ".join(default) if isinstance(default, list) else default
        text += f" Default: {shown}."
    return text.strip()


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Replace a `$ref` (or pydantic's single-element `allOf` wrapper) by a copy of its target.

    Keywords next to the reference (a field's description or default) win over the target's.
    """
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**{k: v for k, v in node.items() if k != "allOf"}, **node["allOf"][0]}
    ref = node.get("$ref")
    if ref is None:
        return node
    target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**target, **siblings}


def _drop_null_branch(node: Schema, path: str) -> Schema:
    """`X | None` becomes plain `X`: an absent field is how Kubernetes spells "no value"."""
    branches = [b for b in node["anyOf"] if b != {"type": "null"}]
    if len(branches) != 1:
        raise SchemaError(f"{path}: unions other than `X | None` have no structural form")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if rest.get("default", ...) is None:
        del rest["default"]
    return {**branches[0], **rest}


def _rewrite(node: Schema, defs: dict[str, Schema], path: str) -> Schema:
    node = _resolve(node, defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        node = _resolve(_drop_null_branch(node, path), defs)
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key in _UNSUPPORTED:
            raise SchemaError(f"{path}: `{key}` has no structural form")
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            raise SchemaError(f"{path}: use ge/le, OpenAPI v3.0 has no numeric {key}")
        if key == "properties":
            out[key] = {name: _rewrite(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _rewrite(value, defs, f"{path}[]")
        elif key == "description":
            out[key] = _describe(node)
        elif key == "additionalProperties":
            if value is False:
                continue  # unknown fields are refused by strict field validation instead
            out[key] = _rewrite(value, defs, f"{path}{{}}")
        else:
            out[key] = value
    if "type" not in out and not (
        out.get("x-kubernetes-int-or-string") or out.get("x-kubernetes-preserve-unknown-fields")
    ):
        raise SchemaError(f"{path}: every node of a structural schema needs a type")
    return out
