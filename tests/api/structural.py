"""An independent checker for Kubernetes structural schemas, written from the apiextensions docs.

It does not reuse pdwarden.api.schema, so a bug in the generator cannot hide itself. It also
validates every `default` against its own node (after applying nested defaults), as the API
server does when the CRD is created.
"""

from __future__ import annotations

import re
from typing import Any

TYPES = {"object", "array", "string", "integer", "number", "boolean"}
FORBIDDEN = {"$ref", "oneOf", "allOf", "not", "definitions", "$defs", "const", "title", "$schema"}


def problems(node: dict[str, Any], path: str = "") -> list[str]:
    """Every structural violation under `node`, as "path: what"."""
    out: list[str] = []
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    for key in FORBIDDEN & node.keys():
        out.append(f"{path}: forbidden keyword {key}")
    if "anyOf" in node and not (
        int_or_string and node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    ):
        out.append(f"{path}: anyOf is only allowed as the int-or-string pattern")
    if "type" not in node and not (int_or_string or preserve):
        out.append(f"{path}: no type")
    if "type" in node and node["type"] not in TYPES:
        out.append(f"{path}: unknown type {node['type']!r}")
    if int_or_string and "type" in node:
        out.append(f"{path}: int-or-string must not have a type")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            out.append(f"{path}: {key} must be a boolean in OpenAPI v3.0")
    if "properties" in node and "additionalProperties" in node:
        out.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("additionalProperties") is False:
        out.append(f"{path}: additionalProperties: false is not structural")
    if node.get("type") == "array" and "items" not in node:
        out.append(f"{path}: array without items")
    if node.get("nullable") is True and "default" in node and node["default"] is None:
        out.append(f"{path}: null default")
    for rule in node.get("x-kubernetes-validations", []):
        if not rule.get("rule") or not rule.get("message"):
            out.append(f"{path}: validation rule without rule or message")
        if "fieldPath" in rule and not resolves(node, rule["fieldPath"]):
            out.append(f"{path}: fieldPath {rule['fieldPath']} names no property")
    if "default" in node:
        out += [
            f"{path}: default {e}" for e in validate(with_defaults(node["default"], node), node)
        ]
        if node.get("x-kubernetes-validations") and isinstance(node["default"], dict):
            # CEL rules see a default as written: nested defaults are not filled in first.
            for name, sub in node.get("properties", {}).items():
                if "default" in sub and name not in node["default"]:
                    out.append(f"{path}: default lacks {name}, which its CEL rules may read")
    for name, sub in node.get("properties", {}).items():
        out += problems(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        out += problems(node["additionalProperties"], f"{path}{{}}")
    if "items" in node:
        out += problems(node["items"], f"{path}[]")
    return out


def resolves(node: dict[str, Any], field_path: str) -> bool:
    for part in field_path.lstrip(".").split("."):
        props = node.get("properties", {})
        if part not in props:
            return False
        node = props[part]
    return True


def with_defaults(value: Any, node: dict[str, Any]) -> Any:
    """`value` with nested defaults filled in, as the API server's structural defaulting does."""
    if isinstance(value, dict) and "properties" in node:
        out = dict(value)
        for name, sub in node["properties"].items():
            if name not in out and "default" in sub:
                out[name] = sub["default"]
            if name in out:
                out[name] = with_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in node:
        return [with_defaults(v, node["items"]) for v in value]
    return value


def validate(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """A small OpenAPI value validator: enough for defaults (types, enums, bounds, patterns)."""
    t = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: {value!r} is not an int or a string"]
    elif t == "object" and not isinstance(value, dict):
        return [f"{path}: {value!r} is not an object"]
    elif t == "array" and not isinstance(value, list):
        return [f"{path}: {value!r} is not an array"]
    elif t == "string" and not isinstance(value, str):
        return [f"{path}: {value!r} is not a string"]
    elif t == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{path}: {value!r} is not an integer"]
    elif t == "boolean" and not isinstance(value, bool):
        return [f"{path}: {value!r} is not a boolean"]
    out: list[str] = []
    if "enum" in node and value not in node["enum"]:
        out.append(f"{path}: {value!r} not in {node['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            out.append(f"{path}: {value} < {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            out.append(f"{path}: {value} > {node['maximum']}")
    if isinstance(value, str):
        if "pattern" in node and not re.search(node["pattern"], value):
            out.append(f"{path}: {value!r} does not match {node['pattern']}")
        if len(value) > node.get("maxLength", len(value)):
            out.append(f"{path}: longer than {node['maxLength']}")
    if isinstance(value, list):
        if len(value) > node.get("maxItems", len(value)):
            out.append(f"{path}: more than {node['maxItems']} items")
        for i, item in enumerate(value):
            out += validate(item, node["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        for name in node.get("required", []):
            if name not in value:
                out.append(f"{path}.{name}: required")
        for name, item in value.items():
            sub = node.get("properties", {}).get(name) or node.get("additionalProperties")
            if isinstance(sub, dict):
                out += validate(item, sub, f"{path}.{name}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{path}.{name}: unknown field")
    return out
