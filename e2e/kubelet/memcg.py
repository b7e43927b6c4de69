"""A container's `resources.limits.memory`, enforced by the kernel as a real kubelet has it done.

Why: a memory limit that nothing enforces hides the one failure it exists for. Each container
with a memory limit runs in a memory cgroup of its own (cgroup v1's `memory` hierarchy, or v2's
unified one) whose limit is the container's; the kernel's OOM killer ends it there exactly as it
would in a pod, and the container's terminated state then says `OOMKilled` (exit code 137).
Where no memory cgroup can be made (not root, no controller), the limit is not enforced: the
kubelet logs it once and `available()` says so, for tests that need enforcement to skip.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from functools import cache
from pathlib import Path

log = logging.getLogger("kubelet.memcg")

PARENT = "pdwarden-kubelet"
_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")
_UNITS = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)(|k|M|G|T|Ki|Mi|Gi|Ti)$")


def quantity_bytes(value: str | int) -> int:
    """A Kubernetes memory quantity ("512Mi", "1G", "134217728") in bytes (ValueError if not)."""
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"not a memory quantity: {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def memory_limit(container: dict[str, object]) -> int | None:
    """The container's memory limit in bytes, or None when it has none."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") if isinstance(resources, dict) else None
    value = limits.get("memory") if isinstance(limits, dict) else None
    if value is None:
        return None
    try:
        return quantity_bytes(value)
    except ValueError as e:
        log.warning("%s: the limit is not enforced", e)
        return None


@cache
def _root() -> tuple[Path, int] | None:
    """Where this kubelet's cgroups go, and the cgroup version; None if none can be made."""
    candidates = [(_V1 / PARENT, 1)]
    if "memory" in _read(_V2 / "cgroup.controllers").split():
        candidates.append((_V2 / PARENT, 2))
    for path, version in candidates:
        try:
            path.mkdir(exist_ok=True)
            if version == 2:
                (path / "cgroup.subtree_control").write_text("+memory")
            return path, version
        except OSError as e:
            log.debug("no memory cgroup at %s: %s", path, e)
    log.warning("no memory cgroup can be made here: container memory limits are not enforced")
    return None


def available() -> bool:
    return _root() is not None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class MemoryCgroup:
    """One container run's cgroup: made before the process starts, removed after it ended."""

    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version

    @classmethod
    def make(cls, name: str, limit: int) -> MemoryCgroup | None:
        root = _root()
        if root is None:
            return None
        parent, version = root
        path = parent / name
        path.mkdir(exist_ok=True)
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(OSError):  # swap accounting is optional; without swap moot
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        else:
            (path / "memory.max").write_text(str(limit))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        return cls(path, version)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def enter(self) -> None:
        """Move the calling process in (run in the child between fork and exec)."""
        self.procs.write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this cgroup."""
        text = _read(self.path / ("memory.oom_control" if self.version == 1 else "memory.events"))
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        return int(m.group(1)) if m else 0

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _read(self.path / name).strip()
        return int(text) if text.isdigit() else 0

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def remove_stale() -> int:
    """Remove the empty cgroups an earlier kubelet left (their processes were reaped)."""
    removed = 0
    for parent in (_V1 / PARENT, _V2 / PARENT):
        children = list(parent.iterdir()) if parent.is_dir() else []
        for child in children:
            if child.is_dir():
                with contextlib.suppress(OSError):  # EBUSY: a live container's, keep it
                    child.rmdir()
                    removed += 1
    return removed


def of_pid(pid: int) -> MemoryCgroup | None:
    """The memory cgroup a process runs in (a container's, for its peak), or None."""
    for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "memory":
            return MemoryCgroup(_V1 / rel.lstrip("/"), 1)
        if controllers == "" and "memory" in _read(_V2 / "cgroup.controllers").split():
            return MemoryCgroup(_V2 / rel.lstrip("/"), 2)
    return None
