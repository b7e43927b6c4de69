"""A pdworker decode is rendered to dial only its own deployment's prefill pods (issue 26).

The decode gets `--prefill-selector` and may list pods (the deployment's discovery account, the
router's, that may read pods and nothing else); the selector matches exactly the deployment's
prefill pod template, not its decode or router pods and not another deployment's prefills.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdwarden.api import parse_spec
from pdwarden.render import Owner, render_deployment

ROOT = Path(__file__).resolve().parents[2]


def rendered(name: str, example: str = "minimal-cpu.yaml") -> dict[tuple[str, str], Any]:
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / example).read_text())
    objs = render_deployment(Owner(name, "ns1", f"uid-{name}"), parse_spec(doc["spec"]))
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def selects(selector: str, labels: dict[str, str]) -> bool:
    pairs = (term.split("=", 1) for term in selector.split(","))
    return all(labels.get(key) == value for key, value in pairs)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_decode_selects_exactly_its_deployments_prefill_pods_and_may_list_them() -> None:
    objs, other = rendered("demo"), rendered("other")
    decode = pod_spec(objs["StatefulSet", "demo-decode"])
    command = decode["containers"][0]["command"]
    selector = command[command.index("--prefill-selector") + 1]
    labels = {
        key: obj["spec"]["template"]["metadata"]["labels"]
        for key, obj in [*objs.items(), *other.items()]
        if key[0] in ("StatefulSet", "Deployment")
    }
    chosen = {name for (_, name), pod_labels in labels.items() if selects(selector, pod_labels)}
    assert chosen == {"demo-prefill"}
    # It lists them as the deployment's discovery account, which may read pods and nothing else.
    account = decode["serviceAccountName"]
    assert decode["automountServiceAccountToken"] is True
    binding = objs["RoleBinding", account]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "ns1"}]
    assert objs["Role", binding["roleRef"]["name"]]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    # The port it may dial is the one the prefill pods declare as "bootstrap".
    prefill = pod_spec(objs["StatefulSet", "demo-prefill"])
    ports = {p["name"]: p["containerPort"] for p in prefill["containers"][0]["ports"]}
    assert command[:2] == ["pdworker", "decode"] and "bootstrap" in ports
    assert "serviceAccountName" not in prefill and prefill["automountServiceAccountToken"] is False


def test_sglang_decodes_get_no_pdworker_flags_and_no_account() -> None:
    decode = pod_spec(rendered("demo", "sglang.yaml")["StatefulSet", "demo-decode"])
    assert "--prefill-selector" not in decode["containers"][0]["command"]
    assert decode["automountServiceAccountToken"] is False
