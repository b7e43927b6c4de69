"""CordonDecode and UncordonDecode on pods a PDRemediationPolicy watches but does not own: a label.

Why a label: those pods belong to LeaderWorkerSet, a StatefulSet or another controller, which
would fight a readiness-gate condition they did not declare. Cordon by label works only if the
Service in front of the decode pods selects the label's serving value (Service selectors are
equality-only, so it includes `<labelKey>: <servingValue>`; `policy.cordon.cordon_check` refuses
while it does not). A cordon sets the label to cordonedValue (the pod leaves the endpoints); an
uncordon sets it back to servingValue, never removes it (a pod without it is not selected either).
The patch is for the incarnation the plan saw, guarded by uid and resourceVersion.
"""

from __future__ import annotations

from pdwarden.api import CordonSpec
from pdwarden.ports import ForeignPodApi
from pdwarden.remediation.act.done import Done, skipped
from pdwarden.remediation.decide import PlannedAction
from pdwarden.remediation.policy.scope import ForeignPod
from pdwarden.values import LabelPatch


def target_value(action: PlannedAction, cordon: CordonSpec) -> str | None:
    """The label value an action means; None for actions that set no label."""
    if action.kind == "CordonDecode":
        return cordon.cordoned_value
    if action.kind == "UncordonDecode":
        return cordon.serving_value
    return None


def label_patch(action: PlannedAction, pod: ForeignPod, cordon: CordonSpec) -> LabelPatch | None:
    """The label change a CordonDecode/UncordonDecode means for `pod`; None if already so, if
    the pod is another incarnation than the one planned for, or for other actions."""
    value = target_value(action, cordon)
    if value is None or (action.uid and action.uid != pod.uid):
        return None
    if pod.labels.get(cordon.label_key) == value:
        return None
    return LabelPatch(pod.name, pod.uid, pod.resource_version, cordon.label_key, value)


async def relabel(
    foreign: ForeignPodApi,
    namespace: str,
    action: PlannedAction,
    pod: ForeignPod,
    cordon: CordonSpec,
) -> Done:
    patch = label_patch(action, pod, cordon)
    if patch is None:
        return skipped("the label already says so, or the pod was replaced")
    result = await foreign.set_pod_label(namespace, patch)
    if result == "Patched":
        return Done(detail=f"label {patch.key}={patch.value}")
    return skipped(f"the pod {'is gone' if result == 'Gone' else 'changed'}")


def applied(action: PlannedAction, pod: ForeignPod, cordon: CordonSpec) -> bool:
    """Whether `pod` carries the label value the action means (whoever set it)."""
    value = target_value(action, cordon)
    return value is not None and pod.labels.get(cordon.label_key) == value
