"""Whether a PDRemediationPolicy's label cordon would take a decode pod out of service.

Why with the policy's scope, below the act stage: the check decides whether cordons are
admitted at all (it is the CordonUnavailable condition), so both the policy's kind adapter
(`kinds.policy_kind`) and the status it records (`record.policy_report`) read it; the act stage only
carries cordons out. Kubernetes Service
selectors are equality-only, so the Service in front must select `<labelKey>: <servingValue>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pdwarden.api import CordonSpec
from pdwarden.remediation.policy.scope import ForeignPod


@dataclass(frozen=True)
class CordonCheck:
    """The CordonUnavailable condition: `unavailable` True blocks cordons, None = cannot tell."""

    unavailable: bool | None
    reason: str
    message: str

    @property
    def allows_cordon(self) -> bool:
        """Cordon unless the Service is known not to honour the label."""
        return self.unavailable is not True


def cordon_check(
    cordon: CordonSpec,
    service_selector: Mapping[str, str] | None,
    decode_pods: tuple[ForeignPod, ...] = (),
) -> CordonCheck:
    """Whether the label cordon would take a decode pod out of service.

    `service_selector` is the selector of the Service named in cordon.serviceRef, or None when
    that Service does not exist (or no serviceRef is set).
    """
    want = f'{cordon.label_key}: "{cordon.serving_value}"'
    if cordon.service_ref is None:
        return CordonCheck(
            None,
            "NoServiceToCheck",
            f"spec.cordon.serviceRef is not set, so pdwarden cannot check that traffic to decode "
            f"pods selects {want}; cordons set the label but may not take pods out of service",
        )
    service = cordon.service_ref.name
    if service_selector is None:
        return CordonCheck(
            True,
            "ServiceNotFound",
            f"Service {service} (spec.cordon.serviceRef) does not exist; not cordoning",
        )
    value = service_selector.get(cordon.label_key)
    if value is None:
        return CordonCheck(
            True,
            "SelectorMissingLabel",
            f"Service {service}'s selector does not include {want}, so a cordon would not take "
            f"a pod out of service; add it to the selector and to the decode pod template",
        )
    if value != cordon.serving_value:
        return CordonCheck(
            True,
            "SelectorValueMismatch",
            f'Service {service} selects {cordon.label_key}: "{value}", not {want}',
        )
    unlabelled = sorted(
        p.name
        for p in decode_pods
        if p.labels.get(cordon.label_key) not in (cordon.serving_value, cordon.cordoned_value)
    )
    message = f"Service {service} selects {want}"
    if unlabelled:
        message += (
            f"; {len(unlabelled)} decode pod(s) lack the label and get no traffic from it "
            f"({', '.join(unlabelled[:8])}): add it to the decode pod template"
        )
    return CordonCheck(False, "SelectorIncludesLabel", message)
