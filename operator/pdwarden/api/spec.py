"""The desired state of a PDDeployment: what to run, how KV moves, and how to repair it.

Why this module exists: `PDDeploymentSpec` is the single source of truth for the CRD's spec
schema (crd.py derives the OpenAPI schema and CEL rules from it) and the object the operator
parses `spec` into at its boundary (parse.py), so both refuse the same specs with the same words.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from pdwarden.api.base import ApiModel, Rule, nested
from pdwarden.api.network import NetworkSpec
from pdwarden.api.pools import RouterSpec, WorkerPoolSpec
from pdwarden.api.remediation import RESTART_PREFILL_NEEDS_ABORT, RemediationSpec
from pdwarden.api.sglang_knobs import SGLangSpec
from pdwarden.api.vllm_knobs import VLLMSpec, owned_flag_rule

Engine = Literal["pdworker", "sglang", "vllm"]
DEFAULT_BOOTSTRAP_PORT = 8998


class ModelSpec(ApiModel):
    """The model every prefill and decode worker loads."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description=(
            "Model to serve. sglang: a Hugging Face id or a path inside the image, passed as "
            "--model-path. vllm: the same, passed as vllm serve's model argument. pdworker: "
            "the name of a model the worker builds itself (e.g. tiny)."
        ),
    )
    served_name: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Name clients send in requests; defaults to name (--served-model-name).",
    )


class TransferSpec(ApiModel):
    """How KV caches move from prefill to decode workers."""

    backend: Literal["nixl"] = Field(
        "nixl", description="KV transfer library; NIXL is the only one supported."
    )
    nixl_backend: Literal["UCX"] = Field(
        "UCX", description="NIXL transport plugin; UCX runs over RDMA, TCP or shared memory."
    )
    bootstrap_port: int = Field(
        DEFAULT_BOOTSTRAP_PORT,
        ge=1024,
        le=65535,
        description=(
            "Port of the prefill workers' bootstrap server, where decode workers fetch the "
            "prefill's KV layout (sglang: --disaggregation-bootstrap-port; vllm: the NIXL "
            "handshake side channel, VLLM_NIXL_SIDE_CHANNEL_PORT)."
        ),
    )


# Flags pdwarden itself puts on an SGLang worker's command line (engines/sglang.py). SGLang's
# argparse keeps the last of a repeated flag, so a copy in args would silently override the spec
# (or, for --tp-size, disagree with the GPUs requested); a spec that repeats one is refused.
# Aliases count: sglang 0.5.23 srt/arg_groups/fields/model.py:51-57 declares `--model` an alias
# of `--model-path`, srt/arg_groups/fields/parallel.py:44-50 `--tensor-parallel-size` one of
# `--tp-size`.
SGLANG_OWNED_FLAGS: tuple[str, ...] = (
    "--model-path",
    "--model",
    "--served-model-name",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--host",
    "--port",
    "--tp-size",
    "--tp",
    "--tensor-parallel-size",
    "--enable-metrics",
)


def _repeats_owned_flag(args: list[str]) -> bool:
    return any(a.split("=", 1)[0] in SGLANG_OWNED_FLAGS for a in args)


def _owned_flag_rule(pool: str) -> Rule:
    flags = ", ".join(f"'{f}'" for f in SGLANG_OWNED_FLAGS)
    return Rule(
        cel=(
            f"self.engine != 'sglang' || !has(self.{pool}) || !has(self.{pool}.args) || "
            f"!self.{pool}.args.exists(a, a in [{flags}] || "
            f"[{flags}].exists(f, a.startsWith(f + '=')))"
        ),
        message=(
            f"{pool}.args must not repeat a flag pdwarden sets for sglang "
            f"({', '.join(SGLANG_OWNED_FLAGS)}): set it through the spec "
            "(model, transfer, gpus for --tp-size)"
        ),
        field_path=f".{pool}.args",
        check=lambda s: s.engine != "sglang" or not _repeats_owned_flag(getattr(s, pool).args),
    )


# An SGLang server without GPUs is a CPU server only when its args say so (SGLang's --device).
_CPU_DEVICE_RE = "(^| )--device[ =]cpu( |$)"


def _sglang_gpus_rule(pool: str) -> Rule:
    return Rule(
        cel=(
            f"self.engine != 'sglang' || !has(self.{pool}) || self.{pool}.gpus >= 1 || "
            f"(has(self.{pool}.args) && self.{pool}.args.join(' ').matches('{_CPU_DEVICE_RE}'))"
        ),
        message=(
            f"{pool}.gpus must be at least 1 when engine is sglang, unless {pool}.args run a "
            "CPU server (--device cpu)"
        ),
        field_path=f".{pool}.gpus",
        check=lambda s: s.engine != "sglang" or _gpus_or_cpu(getattr(s, pool)),
    )


def _gpus_or_cpu(pool: WorkerPoolSpec) -> bool:
    return pool.gpus >= 1 or re.search(_CPU_DEVICE_RE, " ".join(pool.args)) is not None


def _restarts_decode(s: PDDeploymentSpec) -> bool:
    r = s.remediation
    return r.mode == "Enforce" and "RestartDecode" in r.actions


class PDDeploymentSpec(ApiModel):
    """A prefill/decode disaggregated serving deployment that pdwarden runs and repairs."""

    engine: Engine = Field(
        "pdworker",
        description=(
            "What the pods run. pdworker: the reference KV-transfer worker that ships with "
            "pdwarden. sglang: stock SGLang images and flags; vllm: stock vLLM images with the "
            "NixlConnector (spec.image is then required)."
        ),
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description=(
            "Container image of every role. Optional for pdworker (defaults to the pdworker image "
            "of the operator's version); required for sglang and vllm."
        ),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Image pull policy of every container; Kubernetes' default if unset."
    )
    model: ModelSpec = Field(description="The model to serve.")
    transfer: TransferSpec = nested(TransferSpec)
    prefill: WorkerPoolSpec = nested(WorkerPoolSpec, "The prefill worker pool.")
    decode: WorkerPoolSpec = nested(
        WorkerPoolSpec, "The decode worker pool; the scale subresource scales this pool."
    )
    router: RouterSpec = nested(RouterSpec, "The router that pairs prefill and decode workers.")
    remediation: RemediationSpec = nested(RemediationSpec)
    sglang: SGLangSpec = nested(SGLangSpec)
    vllm: VLLMSpec = nested(VLLMSpec)
    # Optional, not nested(): unset is the common case and stores nothing (kubectl explain shows
    # NetworkSpec's docstring).
    network: NetworkSpec | None = None

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.engine != 'sglang' || has(self.image)",
            message="image is required when engine is sglang: pdwarden ships no SGLang image",
            field_path=".image",
            check=lambda s: s.engine != "sglang" or s.image is not None,
        ),
        Rule(
            cel="self.engine != 'vllm' || has(self.image)",
            message="image is required when engine is vllm: pdwarden ships no vLLM image",
            field_path=".image",
            check=lambda s: s.engine != "vllm" or s.image is not None,
        ),
        _sglang_gpus_rule("prefill"),
        _sglang_gpus_rule("decode"),
        RESTART_PREFILL_NEEDS_ABORT,
        _owned_flag_rule("prefill"),
        _owned_flag_rule("decode"),
        owned_flag_rule("prefill"),
        owned_flag_rule("decode"),
        Rule(
            cel=(
                "!has(self.remediation) || !has(self.decode) || "
                "self.remediation.mode != 'Enforce' || "
                "!('RestartDecode' in self.remediation.actions) || self.decode.replicas >= 1"
            ),
            message=(
                "decode.replicas must be at least 1 while remediation may restart decode pods; "
                "set remediation.mode to DryRun or Off to scale decode to zero"
            ),
            field_path=".decode.replicas",
            check=lambda s: not _restarts_decode(s) or s.decode.replicas >= 1,
        ),
    )
