"""Read one PDDeployment or PDRemediationPolicy for the command line (`pdwarden status`), with
errors a person can act on.

Why separate from `client.KubeClient`: the CLI is synchronous, runs once and exits, and needs its
failures (no kubeconfig, unreachable API server, no such object, CRD not installed) turned into
one sentence that says what to do next, not a traceback.
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from pdwarden.constants import (
    GROUP,
    KIND,
    PLURAL,
    POLICY_KIND,
    POLICY_PLURAL,
    POLICY_SHORT_NAME,
    SHORT_NAME,
    VERSION,
)

DEFAULT_TIMEOUT = 10.0


class FetchError(Exception):
    """The object could not be read; the message says why and what to try."""


def load_api(kubeconfig: str | None) -> k8s.ApiClient:
    """An API client from --kubeconfig, else KUBECONFIG / ~/.kube/config, else in-cluster."""
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            try:
                k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                return k8s.ApiClient()
            except k8s_config.ConfigException:
                pass
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    except (
        k8s_config.ConfigException,
        yaml.YAMLError,
        OSError,
        ValueError,
        TypeError,
        KeyError,
    ) as e:
        raise FetchError(
            f"cannot load a kubeconfig from {where}: {e}. Pass --kubeconfig PATH or set KUBECONFIG."
        ) from None
    return k8s.ApiClient(configuration)


# kind -> (plural, short name)
KINDS: dict[str, tuple[str, str]] = {
    KIND: (PLURAL, SHORT_NAME),
    POLICY_KIND: (POLICY_PLURAL, POLICY_SHORT_NAME),
}


class NotFound(FetchError):
    """No object of that kind and name (the kind itself is served)."""


def get_pddeployment(
    name: str, namespace: str, kubeconfig: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """GET the PDDeployment as the API server returns it (camelCase wire form)."""
    return get_object(KIND, name, namespace, kubeconfig, timeout)


def get_object(
    kind: str,
    name: str,
    namespace: str,
    kubeconfig: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """GET a PDDeployment or PDRemediationPolicy as the API server returns it."""
    plural, _ = KINDS[kind]
    api = k8s.CustomObjectsApi(load_api(kubeconfig))
    try:
        obj = api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name, _request_timeout=timeout
        )
    except ApiException as e:
        message = _explain(e, kind, name, namespace)
        if e.status == 404 and "not found in namespace" in message:
            raise NotFound(message) from None
        raise FetchError(message) from None
    except (HTTPError, OSError) as e:
        host = api.api_client.configuration.host
        raise FetchError(
            f"cannot reach the API server at {host}: {type(e).__name__}. "
            "Check the cluster is up and the kubeconfig points at it."
        ) from None
    if not isinstance(obj, dict):
        raise FetchError(f"unexpected answer for {kind} {namespace}/{name}")
    return obj


def _explain(e: ApiException, kind: str, name: str, namespace: str) -> str:
    plural, short = KINDS[kind]
    try:
        message = str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        message = str(e.reason)
    if e.status == 404 and f'"{name}" not found' in message:
        return (
            f'{kind} "{name}" not found in namespace "{namespace}". '
            f"List them with: kubectl get {short} -A"
        )
    if e.status == 404:
        return (
            f"the API server does not serve {plural}.{GROUP}/{VERSION}: is the CRD installed? "
            "Install it with: pdwarden crd | kubectl apply -f -"
        )
    if e.status in (401, 403):
        return f"not allowed to read {kind} {namespace}/{name}: {message}"
    return f"API server answered {e.status} for {kind} {namespace}/{name}: {message}"
