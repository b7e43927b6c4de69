"""The generated CRD: no drift from the models, structural, and useful to `kubectl explain`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pdwarden import constants
from pdwarden.api import build_crd, render_crd_yaml
from pdwarden.api.schema import SchemaError, structural_schema
from pdwarden.api.spec import PDDeploymentSpec
from pdwarden.cli import main

from . import structural
from .cases import CRD_FILE


def _version() -> dict[str, Any]:
    versions: list[dict[str, Any]] = build_crd()["spec"]["versions"]
    assert len(versions) == 1
    return versions[0]


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = _version()["schema"]["openAPIV3Schema"]
    return schema


def test_pdwarden_crd_prints_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--kind", "PDDeployment"]) == 0
    printed = capsys.readouterr().out
    assert printed == CRD_FILE.read_text(), "crds/ drifted from the models: run `make crd`"


def test_output_is_deterministic_yaml_of_the_dict() -> None:
    text = render_crd_yaml()
    assert text == render_crd_yaml()
    assert yaml.safe_load(text) == build_crd()


def test_identity_matches_the_contract() -> None:
    crd = build_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "pddeployments.pdwarden.dev"
    spec = crd["spec"]
    assert spec["group"] == constants.GROUP == "pdwarden.dev"
    assert spec["names"]["kind"] == "PDDeployment"
    assert spec["names"]["plural"] == "pddeployments"
    assert spec["names"]["shortNames"] == ["pdd"]
    assert spec["scope"] == "Namespaced"
    v = _version()
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert v["subresources"]["status"] == {}


def test_schema_is_structural_and_defaults_validate() -> None:
    assert structural.problems(_schema()) == []


def test_checker_catches_what_it_should() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "b": {"type": "integer", "default": "1"},
            "c": {"$ref": "#/x"},
            "d": {"type": "array"},
            "e": {"type": "object", "properties": {}, "additionalProperties": False},
            "f": {"type": "object", "x-kubernetes-validations": [
                {"rule": "true", "message": "m", "fieldPath": ".nope"}]},
            "g": {"type": "object", "default": {},
                  "x-kubernetes-validations": [{"rule": "self.x > 0", "message": "m"}],
                  "properties": {"x": {"type": "integer", "default": 1}}},
        },
    }  # fmt: skip
    found = "\n".join(structural.problems(bad))
    for path in (".a", ".b", ".c", ".d", ".e", ".f", ".g"):
        assert f"{path}:" in found


def test_every_field_is_described_for_kubectl_explain() -> None:
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path != ".metadata" and not node.get("description"):
            missing.append(path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if "items" in node and "properties" in node["items"]:
            for name, sub in node["items"]["properties"].items():
                walk(sub, f"{path}[].{name}")

    walk(_schema(), "")
    assert missing == []


def test_remediation_schema_teaches() -> None:
    rem = _schema()["properties"]["spec"]["properties"]["remediation"]
    assert "inflight queue" in rem["description"]
    props = rem["properties"]
    assert props["mode"]["enum"] == ["Enforce", "DryRun", "Off"]
    assert props["actions"]["items"]["enum"] == [
        "FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill",
    ]  # fmt: skip
    assert props["actions"]["x-kubernetes-list-type"] == "set"
    assert props["maxUnavailableDecode"] == {
        "default": "25%",
        "description": props["maxUnavailableDecode"]["description"],
        "x-kubernetes-int-or-string": True,
    }
    # kubectl explain prints no defaults, so the description carries them.
    assert props["wedgeAfterSeconds"]["description"].endswith("Default: 60.")
    assert "\n" not in props["wedgeAfterSeconds"]["description"]
    assert rem["default"]["wedgeAfterSeconds"] == 60
    assert rem["default"]["actions"] == [
        "FailRooms", "CordonDecode", "RestartDecode", "AbortRequests",
    ]  # fmt: skip
    messages = [r["message"] for r in rem["x-kubernetes-validations"]]
    assert any("wedgeAfterSeconds" in m for m in messages)


def test_cel_rules_on_lists_and_maps_are_bounded() -> None:
    """Unbounded lists or maps under a CEL rule make the API server refuse the CRD (cost)."""
    unbounded: list[str] = []

    def walk(node: dict[str, Any], path: str, under_rule: bool) -> None:
        under_rule = under_rule or bool(node.get("x-kubernetes-validations"))
        if under_rule and node.get("type") == "array" and "maxItems" not in node:
            unbounded.append(path)
        if under_rule and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}", under_rule)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}[]", under_rule)

    walk(_schema()["properties"]["spec"], "spec", False)
    assert unbounded == []


def test_printer_columns_and_scale() -> None:
    v = _version()
    names = [c["name"] for c in v["additionalPrinterColumns"]]
    assert names[:3] == ["Engine", "Prefill", "Decode"]
    assert {"Wedged", "Phase", "Age"} <= set(names)
    status = _schema()["properties"]["status"]["properties"]
    assert status["prefill"]["properties"]["summary"]["type"] == "string"
    assert status["wedgedRooms"]["type"] == "integer"
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.decode.replicas"
    assert "selector" in status["decode"]["properties"]


def test_generator_refuses_unions_it_cannot_express() -> None:
    from pydantic import BaseModel

    class Odd(BaseModel):
        x: int | list[int]

    with pytest.raises(SchemaError, match="unions"):
        structural_schema(Odd)


def test_spec_schema_requires_the_model_only() -> None:
    assert structural_schema(PDDeploymentSpec)["required"] == ["model"]
