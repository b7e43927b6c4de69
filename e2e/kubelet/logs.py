"""`python -m e2e.kubelet.logs`: print a pod's container log from the kubelet's state dir.

Why: there is no `kubectl logs` (no kubelet API server); tests and humans read the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def log_files(state_dir: Path, namespace: str, pod: str, container: str | None) -> list[Path]:
    """Log files of the newest incarnation (UID) of the pod, oldest restart first."""
    uids = sorted((state_dir / "pods" / namespace / pod).glob("*"), key=lambda p: p.stat().st_mtime)
    if not uids:
        return []
    logs = uids[-1] / "logs"
    dirs = [logs / container] if container else sorted(p for p in logs.glob("*") if p.is_dir())
    out: list[Path] = []
    for d in dirs:
        out += sorted(d.glob("*.log"), key=lambda p: int(p.stem))
    return out


def read_log(
    state_dir: Path, namespace: str, pod: str, container: str | None = None, previous: bool = False
) -> str:
    files = log_files(state_dir, namespace, pod, container)
    if previous:
        files = files[-2:-1]
    elif files:
        files = files[-1:]
    return "".join(f.read_text(errors="replace") for f in files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.kubelet.logs", description=__doc__)
    p.add_argument("--state-dir", type=Path, default=Path(".cluster/kubelet"))
    p.add_argument("namespace")
    p.add_argument("pod")
    p.add_argument("-c", "--container")
    p.add_argument("-p", "--previous", action="store_true", help="the run before the last restart")
    a = p.parse_args(argv)
    if not log_files(a.state_dir, a.namespace, a.pod, a.container):
        print(f"no logs for {a.namespace}/{a.pod} under {a.state_dir}", file=sys.stderr)
        return 1
    sys.stdout.write(read_log(a.state_dir, a.namespace, a.pod, a.container, a.previous))
    return 0


if __name__ == "__main__":
    sys.exit(main())
