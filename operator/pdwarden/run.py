"""`pdwarden run`: start the kopf operator with the options given on the command line.

Why a module of its own: it is the only place that starts servers (liveness, metrics) and an
event loop; the CLI stays a parser and the handlers stay importable without side effects.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
from pathlib import Path
from typing import get_args

import kopf
from prometheus_client import start_http_server

from pdwarden import metrics
from pdwarden.api.status import LedgerAction
from pdwarden.main import RunConfig, build_registry, exact_namespaces
from pdwarden.remediation.detect.evidence import Reason
from pdwarden.remediation.scrape.prometheus import DEFAULT_MAX_BYTES as PROMETHEUS_MAX_BYTES
from pdwarden.remediation.scrape.prometheus import DEFAULT_TIMEOUT as PROMETHEUS_TIMEOUT
from pdwarden.remediation.scrape.prometheus import PrometheusConfig
from pdwarden.remediation.scrape.worker_client import DEFAULT_MAX_BODY, MAX_BODY_LIMIT
from pdwarden.sharding import Shard, ShardError
from pdwarden.tokens import TokenKey, TokenKeyError

# Where a pod's ServiceAccount namespace is mounted (the fallback when POD_NAMESPACE is unset).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    host = os.environ.get("POD_IP") or "127.0.0.1"
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )  # fmt: skip
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    ha = parser.add_mutually_exclusive_group()
    ha.add_argument(
        "--standalone", action="store_true",
        help="run without peering (default): only safe with a single operator replica",
    )  # fmt: skip
    ha.add_argument(
        "--peering", metavar="NAME",
        help="coordinate with other replicas through the KopfPeering object NAME "
        "(crds/kopf-peering.yaml); only the highest-priority live replica acts",
    )  # fmt: skip
    parser.add_argument(
        "--priority", type=int, default=None,
        help="peering priority of this replica (default: random, so replicas never tie)",
    )  # fmt: skip
    parser.add_argument(
        "--peering-lifetime", type=int, default=60,
        help="seconds a silent peer still counts as alive; a standby takes over after it (60)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default=host, help=f"address for the liveness and metrics servers ({host})"
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="serve /healthz here; 0 disables"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="serve Prometheus /metrics here; 0 disables"
    )
    parser.add_argument(
        "--shard", metavar="INDEX/COUNT", default=None,
        help="handle only the PDDeployments and PDRemediationPolicies whose namespace/name "
        "hashes to INDEX of COUNT (pdwarden/sharding.py); run COUNT replicas, 0..COUNT-1, each "
        "with its own --peering name for HA. Default: every object",
    )  # fmt: skip
    parser.add_argument(
        "--resync-seconds", type=float, default=5.0,
        help="level-based reconcile passes of one PDDeployment come at most this often: when "
        "its pods or workloads changed (watched), else only every 300 s (5)",
    )  # fmt: skip
    parser.add_argument(
        "--watch-cache", action=argparse.BooleanOptionalAction, default=True,
        help="keep the PDDeployments' pods and workloads in memory from watches (default); "
        "--no-watch-cache: list them from the API server on every pass and cycle",
    )  # fmt: skip
    parser.add_argument(
        "--token-key-file", default=os.environ.get("PDWARDEN_TOKEN_KEY_FILE"),
        help="key from which workers' admin tokens are derived; with it the operator never "
        "reads Secrets (the Helm chart mounts one). Without it the operator reads each "
        "deployment's admin Secret. Default: $PDWARDEN_TOKEN_KEY_FILE",
    )  # fmt: skip
    parser.add_argument(
        "--global-dry-run", action="store_true",
        help="treat every PDDeployment in Enforce mode as DryRun: decide, record, never act",
    )  # fmt: skip
    parser.add_argument(
        "--max-metrics-bytes", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
        help="largest worker /metrics (or rooms) answer read; a larger one is a scrape error "
        f"that names its size ({DEFAULT_MAX_BODY}, at most {MAX_BODY_LIMIT})",
    )  # fmt: skip
    parser.add_argument(
        "--policies", action=argparse.BooleanOptionalAction, default=True,
        help="watch PDRemediationPolicies and remediate the pods they select (default); "
        "--no-policies: the operator does not watch the kind at all (Helm: policies.enabled)",
    )  # fmt: skip
    parser.add_argument(
        "--operator-namespace", metavar="NAMESPACE",
        default=os.environ.get("POD_NAMESPACE") or None,
        help="namespace of the operator's own pods: worker NetworkPolicies admit the operator "
        "only from there. Default: $POD_NAMESPACE, else the pod's ServiceAccount namespace; "
        "outside a cluster none (the policies then admit no operator pod)",
    )  # fmt: skip
    screen = parser.add_argument_group(
        "observation", "how worker pods are read: each scraped by the operator (direct), or "
        "screened through the Prometheus that already scrapes them (prometheus; docs/operations.md)"
    )  # fmt: skip
    screen.add_argument(
        "--observe", choices=("direct", "prometheus"), default="direct",
        help="direct (default): scrape every worker pod each interval; prometheus: one query "
        "per interval screens them all, suspects are read directly, actions rest only on "
        "direct reads",
    )  # fmt: skip
    screen.add_argument("--prometheus-url", metavar="URL", help="Prometheus's base URL")
    screen.add_argument(
        "--prometheus-token-file", metavar="FILE",
        help="a bearer token for Prometheus, read again for every query",
    )  # fmt: skip
    screen.add_argument("--prometheus-ca-file", metavar="FILE", help="CA bundle for https")
    screen.add_argument(
        "--prometheus-cert-file", metavar="FILE",
        help="client certificate (mTLS), with --prometheus-key-file",
    )  # fmt: skip
    screen.add_argument("--prometheus-key-file", metavar="FILE", help="client key (mTLS)")
    screen.add_argument(
        "--prometheus-timeout", type=float, default=PROMETHEUS_TIMEOUT, metavar="SECONDS",
        help=f"one screen query, all of it ({PROMETHEUS_TIMEOUT:g})",
    )  # fmt: skip
    screen.add_argument(
        "--prometheus-max-bytes", type=int, default=PROMETHEUS_MAX_BYTES, metavar="BYTES",
        help=f"largest screen answer read ({PROMETHEUS_MAX_BYTES})",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def prometheus_config(args: argparse.Namespace) -> PrometheusConfig | None:
    """The screen's configuration (--observe prometheus), or None (direct); SystemExit with
    what is wrong."""
    if args.observe == "direct":
        if args.prometheus_url:
            raise SystemExit("pdwarden run: --prometheus-url needs --observe prometheus")
        return None
    if not args.prometheus_url:
        raise SystemExit("pdwarden run: --observe prometheus needs --prometheus-url")
    exact = tuple(args.namespace) if exact_namespaces(tuple(args.namespace)) else ()
    try:
        return PrometheusConfig(
            url=args.prometheus_url, token_file=args.prometheus_token_file,
            ca_file=args.prometheus_ca_file, cert_file=args.prometheus_cert_file,
            key_file=args.prometheus_key_file, timeout=args.prometheus_timeout,
            max_bytes=args.prometheus_max_bytes, namespaces=exact,
        )  # fmt: skip
    except ValueError as e:
        raise SystemExit(f"pdwarden run: {e}") from None


def operator_namespace(given: str | None, fallback: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The operator's namespace: as given, else the pod's ServiceAccount namespace, else None."""
    if given is None:
        try:
            given = fallback.read_text(encoding="utf-8").strip()
        except OSError:
            return None
    if not DNS_LABEL.match(given):
        raise SystemExit(f"pdwarden run: --operator-namespace {given!r} is not a namespace name")
    return given


def run(args: argparse.Namespace) -> int:
    if args.resync_seconds <= 0:
        raise SystemExit("pdwarden run: --resync-seconds must be positive")
    if not 0 < args.max_metrics_bytes <= MAX_BODY_LIMIT:
        raise SystemExit(f"pdwarden run: --max-metrics-bytes must be 1..{MAX_BODY_LIMIT}")
    try:
        token_key = TokenKey(args.token_key_file) if args.token_key_file else None
        shard = Shard.parse(args.shard) if args.shard is not None else None
        prometheus = prometheus_config(args)
    except (TokenKeyError, ShardError) as e:
        raise SystemExit(f"pdwarden run: {e}") from None
    own_namespace = operator_namespace(args.operator_namespace)
    kopf.configure(verbose=args.verbose)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if own_namespace is None:
        logging.getLogger("pdwarden.run").warning(
            "operator namespace unknown (not in a pod?): worker NetworkPolicies admit no "
            "operator pod; pass --operator-namespace"
        )
    registry = build_registry(
        RunConfig(
            resync_seconds=args.resync_seconds,
            token_key=token_key,
            global_dry_run=args.global_dry_run,
            peering_lifetime=args.peering_lifetime,
            max_metrics_bytes=args.max_metrics_bytes,
            policies=args.policies,
            namespaces=tuple(args.namespace),
            watch_cache=args.watch_cache,
            operator_namespace=own_namespace,
            shard=shard,
            prometheus=prometheus,
        )
    )
    if args.metrics_port:
        metrics.declare_series(get_args(LedgerAction), get_args(Reason))
        start_http_server(args.metrics_port, addr=args.host)
    liveness = f"http://{args.host}:{args.liveness_port}/healthz" if args.liveness_port else None
    namespaces = list(args.namespace)
    priority = args.priority if args.priority is not None else random.randint(1, 1_000_000)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
        )
    )
    return 0
