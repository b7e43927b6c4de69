"""Which pods set something that switches their engine's own safety nets off: the Advisories
condition and what its Events say.

Why here, beside detection: like a wedge, an advisory is read from what the cycle already has
(the pod objects it listed), by pure rules (each engine's `advisories`, engines/*_advice.py), and
reported in the status and as Events. Unlike a wedge it is a warning only: nothing here reaches
detection's findings, the plan or any action, and a pod is never refused for it. Everything is
bounded: the advisories kept per cycle, the ones a condition message lists, the length of a value
as shown.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pdwarden import engines
from pdwarden.engines.protocol import Advice
from pdwarden.remediation.scrape import sanitize

log = logging.getLogger("pdwarden.remediation.detect.advisories")
MAX_ADVISORIES: Final = 256  # kept per cycle (and so announced, over cycles)
MAX_LISTED: Final = 8  # named in the condition message; the rest are counted
MAX_SHOWN_VALUE: Final = 64  # characters of a pod's value, as a message shows it
MAX_MESSAGE: Final = 4000
REASON_FOUND: Final = "RiskySettings"
REASON_NONE: Final = "NoRiskySettings"


@dataclass(frozen=True)
class PodAdvice:
    """One rule that fires on one pod."""

    pod: str
    uid: str
    advice: Advice

    @property
    def key(self) -> tuple[str, str]:
        """Its identity while it lasts: the pod incarnation and the rule (a pod's command line
        and environment cannot change without a new pod)."""
        return (self.uid or self.pod, self.advice.rule.name)

    def sentence(self) -> str:
        rule = self.advice.rule
        value = sanitize.text(self.advice.value, MAX_SHOWN_VALUE)
        return f"{self.pod}: {rule.setting} = {value}: {rule.risk} ({rule.source})"

    def event_id(self, owner_uid: str) -> str:
        """A stable name suffix, so a second post (another replica, a restart) is refused."""
        raw = f"{owner_uid}/{self.uid or self.pod}/{self.advice.rule.name}"
        return "adv" + hashlib.sha256(raw.encode()).hexdigest()[:16]


def _meta(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or ""), str(meta.get("uid") or "")


def advise(pods: Sequence[Mapping[str, Any]], engine: str) -> tuple[PodAdvice, ...]:
    """Every advisory on these pods, by pod name then rule, at most MAX_ADVISORIES."""
    rules = engines.get(engine)
    out = []
    for pod in pods:
        name, uid = _meta(pod)
        if not name:
            continue
        try:
            found = rules.advisories(pod)
        except Exception:  # a warning must never cost the cycle: this pod gets none
            log.exception("advisories of pod %s could not be read", name)
            continue
        out += [PodAdvice(name, uid, a) for a in found]
    out.sort(key=lambda a: (a.pod, a.advice.rule.name))
    return tuple(out[:MAX_ADVISORIES])


def condition(advisories: Sequence[PodAdvice]) -> tuple[bool, str, str]:
    """(status, reason, message) of the Advisories condition."""
    if not advisories:
        return False, REASON_NONE, "no pod sets anything that switches its engine's safety nets off"
    pods = len({a.pod for a in advisories})
    listed = "; ".join(a.sentence() for a in advisories[:MAX_LISTED])
    more = len(advisories) - MAX_LISTED
    message = (
        f"{len(advisories)} setting(s) on {pods} pod(s) switch an engine's own safety net off "
        f"(warnings only: nothing is blocked or changed): {listed}"
        + (f"; and {more} more" if more > 0 else "")
    )
    return True, REASON_FOUND, sanitize.text(message, MAX_MESSAGE)
