"""Every example manifest is a valid PDDeployment that the models accept as written."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden import constants
from pdwarden.api import parse_spec

from .cases import EXAMPLES, load_examples

EXAMPLE_DOCS = load_examples()


def test_the_four_examples_exist() -> None:
    assert {"minimal-cpu.yaml", "gpu.yaml", "sglang.yaml", "dryrun.yaml"} <= set(EXAMPLE_DOCS)
    assert len(EXAMPLES) == len(EXAMPLE_DOCS)


@pytest.mark.parametrize("name", sorted(EXAMPLE_DOCS))
def test_example_parses(name: str) -> None:
    doc: dict[str, Any] = EXAMPLE_DOCS[name]
    assert doc["apiVersion"] == constants.API_VERSION
    assert doc["kind"] == constants.KIND
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    parse_spec(doc["spec"])


def test_examples_show_what_they_promise() -> None:
    minimal = parse_spec(EXAMPLE_DOCS["minimal-cpu.yaml"]["spec"])
    assert minimal.image == "pdwarden/pdworker:dev"
    assert (minimal.prefill.gpus, minimal.decode.gpus) == (0, 0)
    assert (minimal.prefill.replicas, minimal.decode.replicas, minimal.router.replicas) == (1, 2, 1)
    gpu = parse_spec(EXAMPLE_DOCS["gpu.yaml"]["spec"])
    assert (gpu.engine, gpu.prefill.gpus, gpu.decode.gpus) == ("pdworker", 1, 1)
    sglang = parse_spec(EXAMPLE_DOCS["sglang.yaml"]["spec"])
    assert sglang.engine == "sglang" and sglang.image
    assert parse_spec(EXAMPLE_DOCS["dryrun.yaml"]["spec"]).remediation.mode == "DryRun"
