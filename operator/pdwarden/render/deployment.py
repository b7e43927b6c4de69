"""Render a whole PDDeployment: worker StatefulSets, Services, router, Secret and PDB.

Why: this is the pure function at the centre of reconciling (`desired = render(spec)`); the
adapter applies its output as is, so everything users see in the cluster can be read off here.
"""

from __future__ import annotations

import base64

from pdwarden import engines
from pdwarden.api import PDDeploymentSpec
from pdwarden.constants import (
    ADMIN_TOKEN_KEY,
    ANNOTATION_TEMPLATE_HASH,
    ROLE_DECODE,
    ROLE_PREFILL,
    ROLE_ROUTER,
    WORKER_PORT,
)
from pdwarden.render.common import (
    Obj,
    Owner,
    content_hash,
    metadata,
    names,
    selector_labels,
)
from pdwarden.render.network_policy import worker_network_policy
from pdwarden.render.pods import pod_template


def render_deployment(
    owner: Owner, spec: PDDeploymentSpec, operator_namespace: str | None = None
) -> list[Obj]:
    """Every object the PDDeployment owns except the token Secrets (see `admin_secret`).
    `operator_namespace`: where the operator's pods run (its NetworkPolicy peer); None when the
    operator runs outside the cluster."""
    n = names(owner.name)
    objects: list[Obj] = []
    for role in (ROLE_PREFILL, ROLE_DECODE):
        objects += [_headless_service(owner, role, spec), _stateful_set(owner, role, spec)]
    objects.append(_decode_pdb(owner, spec))
    allow_from = spec.network.allow_from if spec.network else ()
    objects.append(worker_network_policy(owner, allow_from, operator_namespace))
    if spec.router.replicas > 0 or engines.get(spec.engine).always_routed:
        objects += _router(owner, spec)
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)
    assert n.prefill != n.decode
    return objects


def admin_secret(owner: Owner, token: str) -> Obj:
    """The per-deployment Secret with the workers' admin token; created once, never rotated here."""
    return _token_secret(owner, names(owner.name).admin_secret, token)


def bootstrap_secret(owner: Owner, token: str) -> Obj:
    """The per-deployment Secret with the KV-handshake key prefill and decode share."""
    return _token_secret(owner, names(owner.name).bootstrap_secret, token)


def _token_secret(owner: Owner, name: str, token: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(owner, name),
        "type": "Opaque",
        "data": {ADMIN_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def _ports(spec: PDDeploymentSpec, role: str) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}]
    if role != ROLE_ROUTER:
        port = spec.transfer.bootstrap_port
        ports.append({"name": "bootstrap", "port": port, "targetPort": "bootstrap"})
    return ports


def _headless_service(owner: Owner, role: str, spec: PDDeploymentSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, names(owner.name).for_role(role), role),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(owner, role),
            "ports": _ports(spec, role),
            "publishNotReadyAddresses": False,
        },
    }


def _stateful_set(owner: Owner, role: str, spec: PDDeploymentSpec) -> Obj:
    n = names(owner.name)
    pool = spec.prefill if role == ROLE_PREFILL else spec.decode
    engine = engines.get(spec.engine)
    template = pod_template(
        owner,
        spec,
        role,
        settings=pool,
        launch=engine.worker_launch(spec, role, owner.name),
        gpus=pool.gpus,
        admin_secret=n.admin_secret if engine.needs_admin_token(spec, role) else None,
        bootstrap_secret=n.bootstrap_secret if engine.bootstrap_key else None,
        # A decode that lists its deployment's prefill pods itself (engines/pdworker.py) gets the
        # router's ServiceAccount, which may read pods in this namespace and nothing else.
        service_account=(
            n.router_account if role == ROLE_DECODE and engine.decode_lists_prefills else None
        ),
    )
    template_hash = content_hash(template)
    template["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(
            owner,
            n.for_role(role),
            role,
            annotations={ANNOTATION_TEMPLATE_HASH: template_hash},
        ),
        "spec": {
            "serviceName": n.for_role(role),
            "replicas": pool.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(owner, role)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Delete",
                "whenScaled": "Delete",
            },
            "template": template,
        },
    }


def _decode_pdb(owner: Owner, spec: PDDeploymentSpec) -> Obj:
    """Voluntary disruptions (drains) take at most one decode pod at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, names(owner.name).decode_pdb, ROLE_DECODE),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner, ROLE_DECODE)},
        },
    }


def _router(owner: Owner, spec: PDDeploymentSpec) -> list[Obj]:
    """The router Deployment and Service, and the RBAC its Kubernetes discovery needs."""
    n = names(owner.name)
    template = pod_template(
        owner,
        spec,
        ROLE_ROUTER,
        settings=spec.router,
        launch=engines.get(spec.engine).router_launch(spec, owner.name, owner.namespace),
        gpus=0,
        admin_secret=None,
        service_account=n.router_account,
    )
    template_hash = content_hash(template)
    template["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(owner, n.router_account, ROLE_ROUTER),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(owner, n.router_account, ROLE_ROUTER),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(owner, n.router_account, ROLE_ROUTER),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": n.router_account,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": n.router_account, "namespace": owner.namespace}
            ],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(
                owner, n.router, ROLE_ROUTER, annotations={ANNOTATION_TEMPLATE_HASH: template_hash}
            ),
            "spec": {
                "replicas": spec.router.replicas,
                "selector": {"matchLabels": selector_labels(owner, ROLE_ROUTER)},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "template": template,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(owner, n.router, ROLE_ROUTER),
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(owner, ROLE_ROUTER),
                "ports": _ports(spec, ROLE_ROUTER),
            },
        },
    ]
