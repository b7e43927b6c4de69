"""The `pdwarden` command line: one entry point for the operator, the CRD and the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pdwarden import __version__
from pdwarden import run as run_module

Command = Callable[[argparse.Namespace], int]


CRD_KINDS = ("PDDeployment", "PDRemediationPolicy")


def _print_crd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pdwarden.api.crd import CRD_FILES

    # CRD_FILES is in CRD_KINDS order; --kind picks one, else every CRD (a multi-document stream
    # that `kubectl apply -f -` takes as it is).
    chosen = [render for kind, render in zip(CRD_KINDS, CRD_FILES.values(), strict=True)
              if args.kind in (None, kind)]  # fmt: skip
    if args.out_dir is None:
        sys.stdout.write("---\n".join(render() for render in chosen))
        return 0
    out = Path(args.out_dir)
    if not out.is_dir():
        print(f"pdwarden crd: {out} is not a directory", file=sys.stderr)
        return 2
    for file_name, render in CRD_FILES.items():
        if render in chosen:
            (out / file_name).write_text(render())
    return 0


def _status(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from pdwarden.cli.status_view import format_status, status_json
    from pdwarden.k8s.fetch import FetchError, NotFound, get_object

    kind, name = _kind_and_name(args.name, args.kind)
    try:
        if kind is not None:
            obj = get_object(kind, name, args.namespace, args.kubeconfig)
        else:  # a PDDeployment, else a PDRemediationPolicy of that name
            try:
                obj = get_object("PDDeployment", name, args.namespace, args.kubeconfig)
            except NotFound as first:
                try:
                    obj = get_object("PDRemediationPolicy", name, args.namespace, args.kubeconfig)
                except FetchError:  # neither: the PDDeployment's answer is the one to show
                    raise first from None
    except FetchError as e:
        print(f"pdwarden status: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(status_json(obj))
    else:
        sys.stdout.write(format_status(obj, now=datetime.now(UTC)))
    return 0


# What `pdwarden status KIND/NAME` and --kind accept, kubectl-style.
STATUS_KINDS = {
    "pddeployment": "PDDeployment",
    "pddeployments": "PDDeployment",
    "pdd": "PDDeployment",
    "pdremediationpolicy": "PDRemediationPolicy",
    "pdremediationpolicies": "PDRemediationPolicy",
    "pdrp": "PDRemediationPolicy",
}


def _kind_and_name(raw: str, kind: str | None) -> tuple[str | None, str]:
    prefix, slash, rest = raw.partition("/")
    if slash and prefix.lower() in STATUS_KINDS:
        return STATUS_KINDS[prefix.lower()], rest
    return (STATUS_KINDS[kind.lower()] if kind else None), raw


def _demo(_: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    # The demo drives the repository's local control plane (e2e/), which is not installed.
    root = Path(__file__).resolve().parents[3]
    if not (root / "e2e" / "demo.py").is_file():
        print(
            "pdwarden demo: the demo needs a source checkout (it starts the repository's local "
            "Kubernetes from e2e/); clone the repository and run `make demo` there.",
            file=sys.stderr,
        )
        return 2
    print(f"pdwarden demo: running `python -m e2e.demo` in {root}", file=sys.stderr, flush=True)
    os.chdir(root)
    os.execv(sys.executable, [sys.executable, "-m", "e2e.demo"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdwarden",
        description=(
            "pdwarden reconciles PDDeployment resources into prefill/decode worker pools and "
            "repairs wedged KV transfers."
        ),
    )
    parser.add_argument("--version", action="version", version=f"pdwarden {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run the operator (in-cluster credentials, else KUBECONFIG)",
        description="Reconcile PDDeployments into worker pools and keep their status true.",
    )
    run_module.add_arguments(run)
    run.set_defaults(func=run_module.run)

    crd = sub.add_parser(
        "crd",
        help="print the CustomResourceDefinitions as YAML",
        description="Print pdwarden's CRDs (PDDeployment, PDRemediationPolicy), or write them.",
    )
    crd.add_argument("--kind", choices=CRD_KINDS, default=None, help="only this kind's CRD")
    crd.add_argument(
        "--out-dir", default=None, help="write <plural>.pdwarden.dev.yaml files here instead"
    )
    crd.set_defaults(func=_print_crd)

    status = sub.add_parser(
        "status",
        help="show a PDDeployment's or PDRemediationPolicy's pods, wedges and actions",
        description=(
            "Show a PDDeployment's pools (or a PDRemediationPolicy's selected pods, refusals and "
            "held-back actions), conditions, current wedges with their evidence, the last "
            "remediation actions and the circuit breaker. NAME is looked up as a PDDeployment, "
            "then as a PDRemediationPolicy; pdrp/NAME or --kind picks one."
        ),
    )
    status.add_argument("name", help="NAME, or KIND/NAME (pdd/NAME, pdrp/NAME)")
    status.add_argument(
        "--kind", choices=sorted(STATUS_KINDS), default=None, help="look up only this kind"
    )
    status.add_argument("-n", "--namespace", default="default")
    status.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)"
    )
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.set_defaults(func=_status)

    demo = sub.add_parser("demo", help="run the end-to-end wedge-and-repair demo")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Unknown options are named before a missing command is, so typos get a useful message.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("a COMMAND is required; see --help")
    func: Command = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
