"""The desired state of a PDRemediationPolicy: remediation for PD pods that pdwarden did not create.

Why a second resource: most PD serving already runs under LeaderWorkerSet, Dynamo, RBG, llm-d or
plain StatefulSets. A policy attaches pdwarden's detection and its remediation safety envelope to
those pods by label selector, without redeploying them. It shares `RemediationSpec` with
PDDeployment (one model: the same limits, rules and words), but a policy starts in DryRun, because
the pods belong to someone else; see `PolicyRemediationSpec`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pdwarden.api.base import ApiModel, Rule, nested
from pdwarden.api.kube import MAX_NAME
from pdwarden.api.remediation import RESTART_PREFILL_NEEDS_ABORT, Mode, RemediationSpec
from pdwarden.api.selector import LabelKey, LabelSelector, LabelValue
from pdwarden.api.spec import Engine
from pdwarden.constants import LABEL_SERVING, SERVING_FALSE, SERVING_TRUE

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PATH_PATTERN = r"^/[A-Za-z0-9/._~%!$&'()*+,;=:@-]*$"
DEFAULT_METRICS_PATH = "/metrics"


class PolicyRemediationSpec(RemediationSpec):
    """How pdwarden detects wedged KV transfers in the selected pods and what it may do about them.

    The same settings, limits and rules as a PDDeployment's spec.remediation, except that mode
    defaults to DryRun: a new policy only reports (status, Events) until you switch it to Enforce.
    For a policy, CordonDecode sets the cordon label to its cordoned value, RestartDecode evicts the
    pod through the Eviction API (PodDisruptionBudgets apply), and maxUnavailableDecode counts the
    pods decodeSelector matches.
    """

    # Only the default differs: a subclass that redeclares one field keeps every other field,
    # limit and CEL rule of RemediationSpec by inheritance, so the two can never drift apart.
    mode: Mode = Field(
        "DryRun",
        description=(
            "Enforce acts; DryRun records what it would do (status, Events) without acting; "
            "Off neither scrapes nor acts. A policy starts in DryRun."
        ),
    )


class MetricsEndpoint(ApiModel):
    """Where each selected pod serves its Prometheus metrics (scraped at the pod IP)."""

    port: int = Field(
        ge=1,
        le=65535,
        description=(
            "Container port of the metrics endpoint, on every selected pod (sglang: the HTTP "
            "server's --port, 30000 unless set)."
        ),
    )
    path: str = Field(
        DEFAULT_METRICS_PATH,
        min_length=1,
        max_length=256,
        pattern=PATH_PATTERN,
        description="HTTP path of the metrics endpoint.",
    )
    scheme: Literal["http", "https"] = Field("http", description="http or https.")


class ServiceRef(ApiModel):
    """A Service in the policy's namespace."""

    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Name of the Service."
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the policy's namespace."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the Secret.")
    key: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key inside the Secret.",
    )


class CordonSpec(ApiModel):
    """How pdwarden takes a decode pod it does not own out of service: a label.

    A running pod cannot get a readiness gate, so the cordon is a label that the Service (or the
    router's selector) in front of the decode pods includes with its serving value. Put
    `<labelKey>: "<servingValue>"` in the decode pod template's labels and in the Service's
    selector; pdwarden cordons a pod by setting the label to cordonedValue (the Service drops the
    pod from its endpoints) and uncordons it by setting it back. A pod recreated by its owner
    starts from the template, serving. pdwarden refuses to cordon (condition CordonUnavailable)
    while the Service named in serviceRef does not select the label's serving value.
    """

    label_key: LabelKey = Field(
        LABEL_SERVING, description="Label that the Service or router selector includes."
    )
    serving_value: LabelValue = Field(
        SERVING_TRUE, min_length=1, description="Label value of a pod in service."
    )
    cordoned_value: LabelValue = Field(
        SERVING_FALSE,
        min_length=1,
        description="Label value pdwarden sets to take a pod out of service.",
    )
    service_ref: ServiceRef | None = Field(
        None,
        description=(
            "The Service in front of the decode pods. pdwarden checks that its selector includes "
            "labelKey: servingValue and refuses to cordon when it does not. Without it pdwarden "
            "cannot check, and says so in the condition CordonUnavailable."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.servingValue != self.cordonedValue",
            message="cordonedValue must differ from servingValue, or a cordon changes nothing",
            field_path=".cordonedValue",
            check=lambda s: s.serving_value != s.cordoned_value,
        ),
    )


class PDRemediationPolicySpec(ApiModel):
    """Wedge detection and remediation for prefill/decode pods that another system runs."""

    engine: Engine = Field(
        description=(
            "What the selected pods run: sglang (stock SGLang in PD mode), vllm (stock vLLM with "
            "the NixlConnector) or pdworker (pdwarden's reference worker). Decides how metrics "
            "are read and how wedges are repaired."
        ),
    )
    prefill_selector: LabelSelector = Field(
        description="Label selector of the prefill pods, in the policy's namespace."
    )
    decode_selector: LabelSelector = Field(
        description=(
            "Label selector of the decode pods, in the policy's namespace. maxUnavailableDecode "
            "counts every pod it matches."
        )
    )
    metrics: MetricsEndpoint = Field(description="Where the selected pods serve metrics.")
    remediation: PolicyRemediationSpec = nested(PolicyRemediationSpec)
    cordon: CordonSpec = nested(CordonSpec)
    admin_token_secret_ref: SecretKeyRef | None = Field(
        None,
        description=(
            "Secret key holding the admin token of engines whose repair endpoints need one "
            "(pdworker's admin API; sglang's --admin-api-key). Read by the operator only."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        RESTART_PREFILL_NEEDS_ABORT,
        # CEL has no equality on objects, so this catches the common mistake (the same
        # matchLabels, no expressions); a pod that both selectors match is refused per pod.
        Rule(
            cel=(
                "(has(self.prefillSelector.matchExpressions) "
                "&& size(self.prefillSelector.matchExpressions) > 0) || "
                "(has(self.decodeSelector.matchExpressions) "
                "&& size(self.decodeSelector.matchExpressions) > 0) || "
                "!has(self.prefillSelector.matchLabels) || "
                "!has(self.decodeSelector.matchLabels) || "
                "self.prefillSelector.matchLabels != self.decodeSelector.matchLabels"
            ),
            message=(
                "prefillSelector and decodeSelector must differ: a pod cannot be both a prefill "
                "and a decode worker"
            ),
            field_path=".decodeSelector",
            check=lambda s: bool(
                s.prefill_selector.match_expressions
                or s.decode_selector.match_expressions
                or s.prefill_selector.match_labels != s.decode_selector.match_labels
            ),
        ),
    )
