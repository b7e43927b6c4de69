"""Bound and clean what workers say before it reaches detection, Events or the status.

Why: every byte a worker pod returns is hostile until shown otherwise. A 254-character peer name
or a negative `phase_seconds` is not worth a crash (the status models would refuse them and the
whole remediation cycle with them), and a control character or a megabyte of error text must not
land in a condition message. These functions never raise: they clip, clamp or drop.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Final

from pdwarden.values import RoomView

MAX_POD_NAME: Final = 253  # a DNS-1123 subdomain, as Kubernetes allows for pod names
MAX_TOKEN: Final = 128  # incarnations, phases: short opaque words
MAX_ERROR: Final = 512  # one pod's scrape error, as shown in a condition message
MAX_SECONDS: Final = 10.0 * 365 * 24 * 3600  # a decade: more is garbage, not an age
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ELLIPSIS: Final = "..."


def text(value: object, limit: int) -> str:
    """Printable, single-line, at most `limit` characters (cut with an ellipsis)."""
    raw = str(value)
    cut = len(raw) > limit
    keep = limit - len(ELLIPSIS) if cut and limit > len(ELLIPSIS) else max(limit, 0)
    out = "".join(c if c.isprintable() else " " for c in raw[:keep])
    return out + ELLIPSIS if cut and limit > len(ELLIPSIS) else out


def pod_name(value: str | None) -> str | None:
    """`value` if it can be a pod name, else None (it cannot name one of our pods)."""
    if value is None or len(value) > MAX_POD_NAME or not _POD_NAME.match(value):
        return None
    return value


def seconds(value: float) -> float:
    """A non-negative finite age, at most MAX_SECONDS; NaN counts as 0."""
    if not math.isfinite(value):
        return MAX_SECONDS if value > 0 else 0.0
    return min(max(value, 0.0), MAX_SECONDS)


def token(value: str | None) -> str | None:
    return None if value is None else text(value, MAX_TOKEN)


def room(view: RoomView) -> RoomView:
    """A room as detection may trust it: a peer that cannot be a pod name is no peer at all
    (nothing is attributed to it, nothing is judged gone because of it)."""
    peer = pod_name(view.peer_pod)
    return replace(
        view,
        phase=text(view.phase, MAX_TOKEN),
        phase_seconds=seconds(view.phase_seconds),
        peer_pod=peer,
        peer_incarnation=token(view.peer_incarnation) if peer is not None else None,
    )


def error(value: str | None) -> str | None:
    return None if value is None else text(value, MAX_ERROR)


def why(e: BaseException) -> str:
    """An exception as one bounded line for a ledger entry, a condition or a log."""
    return text(str(e) or type(e).__name__, MAX_ERROR)
