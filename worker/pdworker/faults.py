"""Fault switches: deliberately re-enable known production bugs so remediation can be tested.

Parsed from `--fault` and the PDWORKER_FAULTS environment variable (comma separated). An unknown
name is a clear error, never silently ignored: a typo must not turn a wedge test into a pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdworker.contract import (
    FAULT_CORRUPT_KV,
    FAULT_DECODE_STALL,
    FAULT_DROP_NOTIFICATIONS,
    FAULT_LEGACY_STATUS_RACE,
    FAULT_NO_INFLIGHT_WATCHDOG,
    FAULTS,
)


class FaultSpecError(ValueError):
    """A --fault / PDWORKER_FAULTS value that cannot be parsed."""


@dataclass(frozen=True)
class Faults:
    """The parsed fault switches; the default instance is a correct worker."""

    legacy_status_race: bool = False
    no_inflight_watchdog: bool = False
    decode_stall: bool = False
    decode_stall_after: int | None = None  # stall after N requests; None = only via admin call
    drop_notifications: float = 0.0
    corrupt_kv: float = 0.0  # decode flips one byte in one landed page of a room, probability P

    def names(self) -> list[str]:
        out = []
        if self.legacy_status_race:
            out.append(FAULT_LEGACY_STATUS_RACE)
        if self.no_inflight_watchdog:
            out.append(FAULT_NO_INFLIGHT_WATCHDOG)
        if self.decode_stall:
            suffix = "" if self.decode_stall_after is None else f"={self.decode_stall_after}"
            out.append(FAULT_DECODE_STALL + suffix)
        if self.drop_notifications:
            out.append(f"{FAULT_DROP_NOTIFICATIONS}={self.drop_notifications:g}")
        if self.corrupt_kv:
            out.append(f"{FAULT_CORRUPT_KV}={self.corrupt_kv:g}")
        return out


def parse_faults(specs: Iterable[str]) -> Faults:
    """Parse fault items such as `legacy-status-race`, `decode-stall=20`, `drop-notifications=0.1`.

    Each element of `specs` may itself be a comma-separated list (flag values and the env var).
    """
    values: dict[str, object] = {}
    for spec in specs:
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            name, has_value, value = item.partition("=")
            name = name.strip()
            value = value.strip()
            if name not in FAULTS:
                raise FaultSpecError(
                    f"unknown fault {name!r}; known faults: {', '.join(FAULTS)} "
                    "(decode-stall[=N], drop-notifications=P, corrupt-kv=P)"
                )
            if name in (FAULT_LEGACY_STATUS_RACE, FAULT_NO_INFLIGHT_WATCHDOG):
                if has_value:
                    raise FaultSpecError(f"fault {name!r} takes no value (got {item!r})")
                values[name.replace("-", "_")] = True
            elif name == FAULT_DECODE_STALL:
                values["decode_stall"] = True
                if has_value:
                    try:
                        after = int(value)
                    except ValueError:
                        after = -1
                    if after < 0:
                        raise FaultSpecError(
                            f"decode-stall=N needs a request count N >= 0 (got {value!r})"
                        )
                    values["decode_stall_after"] = after
            else:
                try:
                    prob = float(value)
                except ValueError:
                    prob = -1.0
                if not has_value or not 0.0 <= prob <= 1.0:
                    raise FaultSpecError(f"{name}=P needs a probability 0 <= P <= 1 (got {item!r})")
                values[name.replace("-", "_")] = prob
    return Faults(**values)  # type: ignore[arg-type]
