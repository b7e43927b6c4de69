"""`python -m e2e.cluster up|down|status`: the local control plane behind make cluster-up/down."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.cluster.controlplane import REPO_ROOT, LocalCluster
from e2e.cluster.processes import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--dir", type=Path, default=REPO_ROOT / ".cluster", help="cluster directory (.cluster)"
    )
    parser.add_argument("--gpu-nodes", type=int, default=2)
    parser.add_argument("--cpu-nodes", type=int, default=1)
    parser.add_argument("--no-kubelet", action="store_true", help="control plane only")
    args = parser.parse_args(argv)
    cluster = LocalCluster(
        args.dir.resolve(),
        gpu_nodes=args.gpu_nodes,
        cpu_nodes=args.cpu_nodes,
        with_kubelet=not args.no_kubelet,
    )
    try:
        if args.action == "up":
            cluster.start()
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.action == "down":
            cluster.stop()
        else:
            alive = cluster.running_pids()
            for name, pid in sorted(alive.items()):
                print(f"{name:26} pid {pid}")
            if not alive:
                print(f"no cluster running from {cluster.directory}")
                return 1
    except ClusterError as e:
        print(f"cluster {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
