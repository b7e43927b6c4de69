"""What `pdwarden status NAME` prints: a PDDeployment or PDRemediationPolicy object to text.

Why pure: the view is the first thing a person reads during an incident, so its layout is unit
tested on plain dicts, with no cluster and no clock (`now` is passed in). Fetching the object
lives in `pdwarden.k8s.fetch`. The table fits a 100-column terminal: long cells are cut with
an ellipsis and evidence is wrapped under the wedge it explains.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, get_args

from pdwarden.api import RemediationSpec
from pdwarden.constants import (
    ANNOTATION_RESET_BREAKER,
    POLICY_KIND,
    POLICY_SHORT_NAME,
    ROLE_DECODE,
    ROLE_PREFILL,
    ROLES,
    SHORT_NAME,
)
from pdwarden.remediation.detect.evidence import Reason

WIDTH: Final = 100
RECENT_ACTIONS: Final = 10
# Shown when the spec leaves it out: the model's own default, never a copy of it.
DEFAULT_MAX_ACTIONS_PER_HOUR: Final = RemediationSpec.model_fields["max_actions_per_hour"].default
_RULES: Final = get_args(Reason)
_FINDING = re.compile(rf"(?:^|; )((?:{'|'.join(_RULES)}) on [^\s:]+): ")

Obj = Mapping[str, Any]


def format_status(obj: Obj, now: datetime | None = None, width: int = WIDTH) -> str:
    """The whole view; times are shown as ages when `now` is given, else as timestamps."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    remediation = spec.get("remediation") or {}
    policy = obj.get("kind") == POLICY_KIND
    kind = POLICY_KIND if policy else "PDDeployment"
    out = [_wrap(_header(meta, spec, status, remediation, kind), width)]
    if not status:
        out.append(
            _wrap(
                f"No status yet: the operator has not reconciled this {kind} "
                "(is `pdwarden run` running and watching this namespace?).",
                width,
            )
        )
    out += ["", _selected(status, width) if policy else _pools(spec, status, width)]
    if policy and status.get("refused"):
        out += ["", _refused(status["refused"], width)]
    if policy and status.get("heldBack"):
        out += ["", _held_back(status["heldBack"], now, width)]
    if status.get("conditions"):
        out += ["", _conditions(status["conditions"], now, width)]
    out += ["", _wedges(status, now, width)]
    rem = status.get("remediation") or {}
    out += ["", _actions(rem.get("history") or [], now, width)]
    short = POLICY_SHORT_NAME if policy else SHORT_NAME
    out += ["", _breaker(rem, remediation, meta, now, width, short=short)]
    return "\n".join(out).rstrip() + "\n"


def status_json(obj: Obj) -> str:
    """The machine-readable form: identity, the remediation policy and the raw status."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    doc = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "generation": meta.get("generation"),
        "remediation": spec.get("remediation") or {},
        "status": obj.get("status") or {},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# -- sections ------------------------------------------------------------------------------


def _header(meta: Obj, spec: Obj, status: Obj, remediation: Obj, kind: str) -> str:
    name = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    gen = f"generation {generation}" + (
        f" (observed {observed})" if observed is not None and observed != generation else ""
    )
    if kind == POLICY_KIND:
        conditions: Sequence[Obj] = status.get("conditions") or []
        ready: Obj = next((c for c in conditions if c.get("type") == "Ready"), {})
        state = f"ready {ready.get('status', 'Unknown')}"
        mode = remediation.get("mode", "DryRun")
    else:
        state, mode = (
            f"phase {status.get('phase') or 'Unknown'}",
            remediation.get("mode", "Enforce"),
        )
    parts = [
        f"{kind} {name}",
        state,
        f"engine {spec.get('engine', '?')}",
        f"remediation {mode}",
        gen,
    ]
    return "   ".join(parts)


def _selected(status: Obj, width: int) -> str:
    """A policy's pods per selector: matched, eligible (not refused), ready, cordoned."""
    rows = []
    for role in (ROLE_PREFILL, ROLE_DECODE):
        st = status.get(role) or {}
        rows.append(
            [
                role,
                str(st.get("matched", "-")),
                str(st.get("eligible", "-")),
                str(st.get("ready", "-")),
                str(st.get("cordoned", 0)) if role == ROLE_DECODE and st else "-",
                str(st.get("selector", "")),
            ]
        )
    return _table(["PODS", "MATCHED", "ELIGIBLE", "READY", "CORDONED", "SELECTOR"], rows, width)


def _refused(refused: Sequence[Obj], width: int) -> str:
    rows = [
        [str(r.get("pod", "?")), str(r.get("reason", "?")), ", ".join(r.get("policies") or [])]
        for r in refused
    ]
    return "Not acted on:\n" + _table(["POD", "REASON", "ALSO SELECTED BY"], rows, width)


def _held_back(held: Sequence[Obj], now: datetime | None, width: int) -> str:
    rows = [
        [_when(h.get("time"), now), str(h.get("action", "?")), str(h.get("pod", "?")),
         _one_line(str(h.get("reason", "")))]
        for h in held
    ]  # fmt: skip
    return "Held back:\n" + _table(["WHEN", "ACTION", "POD", "REASON"], rows, width)


def _pools(spec: Obj, status: Obj, width: int) -> str:
    rows = []
    for role in ROLES:
        st, desired = status.get(role) or {}, (spec.get(role) or {}).get("replicas")
        cordoned = str(st.get("cordonedReplicas", 0)) if role == "decode" else "-"
        rows.append(
            [
                role,
                str(st["readyReplicas"]) if "readyReplicas" in st else "-",
                str(st.get("replicas", desired if desired is not None else "-")),
                str(st["updatedReplicas"]) if "updatedReplicas" in st else "-",
                cordoned if st else "-",
            ]
        )
    return _table(["POOL", "READY", "DESIRED", "UPDATED", "CORDONED"], rows, width)


def _conditions(conditions: Sequence[Obj], now: datetime | None, width: int) -> str:
    rows = [
        [
            str(c.get("type", "")),
            str(c.get("status", "")),
            str(c.get("reason", "")),
            _when(c.get("lastTransitionTime"), now),
            _one_line(str(c.get("message", ""))),
        ]
        for c in conditions
    ]
    return _table(["CONDITION", "STATUS", "REASON", _time_header(now), "MESSAGE"], rows, width)


def _wedges(status: Obj, now: datetime | None, width: int) -> str:
    wedges = status.get("wedges") or []
    if not wedges:
        return "WEDGES: none"
    evidence = _evidence(status.get("conditions") or [], wedges)
    rows, notes = [], []
    for i, w in enumerate(wedges):
        rows.append(
            [
                str(w.get("pod", "")),
                str(w.get("role", "")),
                str(w.get("reason", "")),
                str(w.get("rooms", 0)),
                f"{float(w['oldestSeconds']):.1f}s" if w.get("oldestSeconds") else "-",
                str(w.get("peer") or "-"),
                _when(w.get("since"), now),
            ]
        )
        notes.append(evidence[i])
    total = status.get("wedgedRooms", sum(int(w.get("rooms") or 0) for w in wedges))
    title = f"WEDGES ({len(wedges)} findings, {total} wedged rooms)"
    headers = ["POD", "ROLE", "REASON", "ROOMS", "OLDEST", "PEER", _time_header(now)]
    lines = _table(headers, rows, width).splitlines()
    body = [lines[0]]
    for line, note in zip(lines[1:], notes, strict=True):
        body.append(line)
        if note:
            body += textwrap.wrap(
                note, width, initial_indent="  evidence: ", subsequent_indent="    ",
                break_on_hyphens=False,
            )  # fmt: skip
    return "\n".join([title, *body])


def _actions(history: Sequence[Obj], now: datetime | None, width: int) -> str:
    if not history:
        return "RECENT ACTIONS: none"
    recent = list(history)[-RECENT_ACTIONS:][::-1]  # newest first
    rows = [
        [
            _when(e.get("time"), now),
            str(e.get("action", "")),
            str(e.get("pod", "")),
            str(e.get("rooms", 0)) if e.get("action") == "FailRooms" else "-",
            str(e.get("outcome", "Succeeded")),
            "yes" if e.get("dryRun") else "no",
            _one_line(str(e.get("reason", ""))),
        ]
        for e in recent
    ]
    title = f"RECENT ACTIONS (newest first, {len(recent)} of {len(history)})"
    headers = [_time_header(now), "ACTION", "POD", "ROOMS", "OUTCOME", "DRY-RUN", "REASON"]
    return "\n".join([title, _table(headers, rows, width)])


def _breaker(
    rem: Obj, policy: Obj, meta: Obj, now: datetime | None, width: int, *, short: str = SHORT_NAME
) -> str:
    limit = policy.get("maxActionsPerHour", DEFAULT_MAX_ACTIONS_PER_HOUR)
    used = rem.get("actionsLastHour", 0)
    if rem.get("suspended"):
        state = (
            f"BREAKER: OPEN, remediation suspended ({used} of {limit} actions in the last hour); "
            f"reset it with `kubectl annotate {short} {meta.get('name', 'NAME')} "
            f"-n {meta.get('namespace', 'default')} {ANNOTATION_RESET_BREAKER}=now` "
            "or by changing the spec"
        )
    else:
        state = f"BREAKER: closed ({used} of {limit} actions in the last hour)"
    lines = [state]
    if rem.get("breakerResetAt"):
        ago = " ago" if now is not None else ""
        lines.append(f"  last reset: {_when(rem['breakerResetAt'], now)}{ago}")
    budget = f"DECODE BUDGET: {rem.get('decodeBudget', 0)} pods may be cordoned or restarting"
    cordoned = rem.get("cordoned") or []
    if cordoned:
        held = ", ".join(
            f"{c.get('pod')} ({'for' if now else 'since'} {_when(c.get('since'), now)})"
            for c in cordoned
        )
        budget += f"; cordoned now: {held}"
    lines.append(budget)
    if isinstance(tally := rem.get("canaries"), dict):
        waited = tally.get("seconds", 0)
        waited = f"{waited:.1f}s" if isinstance(waited, int | float) else "?"
        lines.append(
            f"CANARIES: {tally.get('sent', 0)} sent, {tally.get('requests', 0)} requests to pods, "
            f"{waited} waited on answers, since {_when(tally.get('since'), now)}"
            f"{' ago' if now is not None else ''}"
        )
    return "\n".join(_wrap(line, width) for line in lines)


# -- helpers -------------------------------------------------------------------------------


def _evidence(conditions: Sequence[Obj], wedges: Sequence[Obj]) -> list[str]:
    """Per wedge, its evidence text from the Wedged condition ("<rule> on <pod>: <evidence>; ...").

    The message lists findings in the order of status.wedges; a segment is only used when its
    rule and pod match the wedge at the same position.
    """
    message = next((str(c.get("message", "")) for c in conditions if c.get("type") == "Wedged"), "")
    marks = list(_FINDING.finditer(message))
    segments = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(message)
        segments.append((m.group(1), message[m.end() : end].strip()))
    out = []
    for i, w in enumerate(wedges):
        key = f"{w.get('reason')} on {w.get('pod')}"
        out.append(segments[i][1] if i < len(segments) and segments[i][0] == key else "")
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str:
    """Left-aligned columns two spaces apart; the last column takes what is left of `width`."""
    cols = len(headers)
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(cols)]
    fixed = sum(widths[:-1]) + 2 * (cols - 1)
    widths[-1] = max(min(widths[-1], width - fixed), len(headers[-1]))
    lines = []
    for r in [list(headers), *rows]:
        cells = [_cut(c, widths[i]).ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _time_header(now: datetime | None) -> str:
    return "AGE" if now is not None else "TIME"


def _when(raw: Any, now: datetime | None) -> str:
    if not raw:
        return "-"
    try:
        t = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return str(raw)
    if now is None or t.tzinfo is None:
        return t.strftime("%Y-%m-%d %H:%M:%S")
    return _age((now - t).total_seconds())


def _age(seconds: float) -> str:
    """kubectl-style: 45s, 3m10s, 2h5m, 3d4h."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"
