"""`python -m e2e.kubelet`: run the local kubelet in the foreground until SIGTERM/SIGINT.

Why a CLI: `make cluster-up` and the pytest fixture start it as one process and stop it with a
signal; on the way out it terminates every pod process it started (SIGTERM, grace, SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from .kubelet import Config, Kubelet

EPILOG = """\
Pods run as local process groups; the container image picks the program (see
e2e/kubelet/images.py: pdwarden, pdworker and python images run from this venv, kubectl images
run the pinned kubectl, busybox/alpine/debian/ubuntu run host commands; anything else fails with
reason ImageNotMapped). Volume mountPaths are rewritten to host directories in command, args,
env values and workingDir. Logs: <state-dir>/pods/<ns>/<pod>/<uid>/logs/<container>/<restart>.log
(`python -m e2e.kubelet.logs --state-dir DIR NAMESPACE POD [-c CONTAINER]`).
"""


def default_kubectl() -> str | None:
    if os.environ.get("PDWARDEN_KUBECTL"):
        return os.environ["PDWARDEN_KUBECTL"]
    cached = sorted(glob.glob(os.path.expanduser("~/.cache/pdwarden/*/bin/kubectl")))
    return cached[-1] if cached else shutil.which("kubectl")


def parse(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m e2e.kubelet",
        description="Local kubelet: registers GPU/CPU nodes and runs their pods as processes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--kubeconfig", required=True, help="admin kubeconfig of the control plane")
    p.add_argument("--state-dir", required=True, type=Path, help="pod dirs, volumes and logs")
    p.add_argument("--gpu-nodes", type=int, default=2, help="nodes gpu-node-0..N-1 (default 2)")
    p.add_argument("--cpu-nodes", type=int, default=1, help="nodes cpu-node-0..N-1 (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu capacity (8)")
    p.add_argument("--node-prefix", default="", help="prefix for node names (default none)")
    p.add_argument(
        "--pod-network",
        choices=["loopback"],
        default="loopback",
        help="loopback (the only mode enabled): pod IP 10.X.N.K is served as 127.X.N.K; needs "
        "no privileges and never touches the host's routes, but the API server rejects such "
        "IPs in EndpointSlices, so Services have no endpoints (see network.py)",
    )
    p.add_argument(
        "--pod-cidr-wait",
        type=float,
        default=30.0,
        help="seconds to wait for spec.podCIDR from the controller-manager (30)",
    )
    p.add_argument(
        "--fallback-cidr",
        default="10.250.0.0/16",
        help="carved into /24s per node when no podCIDR is allocated",
    )
    p.add_argument("--kubectl", default=default_kubectl(), help="kubectl for `kubectl` images")
    p.add_argument(
        "--pass-env",
        action="append",
        default=["TMPDIR", "TZ"],
        help="host env var to pass to pods (repeatable; default TMPDIR, TZ)",
    )
    p.add_argument("--backoff-base", type=float, default=10.0, help="crash back-off start (10s)")
    p.add_argument("--backoff-max", type=float, default=300.0, help="crash back-off cap (300s)")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=5.0,
        help="SIGTERM-to-SIGKILL seconds for pods when the kubelet stops (5)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    a = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        format="%(asctime)s kubelet %(levelname).1s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    return Config(
        kubeconfig=a.kubeconfig,
        state_dir=a.state_dir.resolve(),
        gpu_nodes=a.gpu_nodes,
        cpu_nodes=a.cpu_nodes,
        gpus_per_node=a.gpus_per_node,
        node_prefix=a.node_prefix,
        pod_network=a.pod_network,
        fallback_cidr=a.fallback_cidr,
        pod_cidr_wait=a.pod_cidr_wait,
        kubectl=a.kubectl,
        pass_env=a.pass_env,
        backoff_base=a.backoff_base,
        backoff_max=a.backoff_max,
        shutdown_grace=a.shutdown_grace,
    )


async def amain(cfg: Config) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    kubelet = Kubelet(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, kubelet.stop.set)
    await kubelet.run()


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    try:
        asyncio.run(amain(cfg))
    except SystemExit as e:
        logging.getLogger("kubelet").error("%s", e)
        return 1
    logging.getLogger("kubelet").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
