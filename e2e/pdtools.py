"""Helpers for end-to-end tests that drive a PDDeployment on a real cluster.

Why: the operator, remediation, Helm and demo tests all apply PDDeployments, wait on their
status, talk to worker pods by pod IP and read the admin token; one module keeps that
vocabulary the same everywhere.
"""

from __future__ import annotations

import base64
import copy
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e.fixtures import Cluster
from e2e.httpjson import http
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, WORKER_PORT

REPO_ROOT = Path(__file__).resolve().parents[1]
CHILDREN_KINDS = [
    "StatefulSet", "Deployment", "Service", "Secret", "PodDisruptionBudget",
    "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy",
]  # fmt: skip
CHILDREN = ",".join(k.lower() for k in CHILDREN_KINDS)


def cpu_example(name: str = "pd", **spec_overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (REPO_ROOT / "manifests" / "examples" / "minimal-cpu.yaml").read_text()
    )
    doc["metadata"]["name"] = name
    doc["spec"] = merge(doc["spec"], spec_overrides)
    return doc


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply(cluster: Cluster, ns: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc))


def get_json(cluster: Cluster, ns: str, *what: str) -> Any:
    out = cluster.kubectl("get", "-n", ns, *what, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def status(cluster: Cluster, ns: str, name: str = "pd") -> dict[str, Any]:
    obj = get_json(cluster, ns, "pdd", name) or {}
    st: dict[str, Any] = obj.get("status") or {}
    return st


def history(cluster: Cluster, ns: str, name: str = "pd") -> list[dict[str, Any]]:
    """The remediation ledger as stored, intents included."""
    entries: list[dict[str, Any]] = (status(cluster, ns, name).get("remediation") or {}).get(
        "history"
    ) or []
    return entries


def pdwarden_warnings(cluster: Cluster, ns: str) -> list[str]:
    """pdwarden's Warning Events in the namespace, "Reason: message", sorted: WedgeDetected,
    failed actions, configuration advisories, metrics over their cap."""
    events = get_json(cluster, ns, "events", "--field-selector", "type=Warning") or {}
    return sorted(
        f"{e['reason']}: {e['message']}"
        for e in events.get("items", [])
        if "pdwarden" in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))
    )


def recorded(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger as done: before each action the operator writes its intent (outcome Pending)
    and replaces it with the record once the action ran, so a test waiting for an action waits
    for its record, never the intent of a moment before."""
    return [e for e in entries if e.get("outcome") != "Pending"]


def ledger(cluster: Cluster, ns: str, name: str = "pd") -> list[dict[str, Any]]:
    """The ledger's records (Pending intents left out)."""
    return recorded(history(cluster, ns, name))


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def wait_ready(
    cluster: Cluster, ns: str, counts: dict[str, str], timeout: float = 180, name: str = "pd"
) -> dict[str, Any]:
    def ready() -> Any:
        obj = get_json(cluster, ns, "pdd", name) or {}
        st = obj.get("status") or {}
        got = {r: (st.get(r) or {}).get("summary") for r in counts}
        # Ready for the spec as it is now: a status computed from an older generation is stale.
        current = st.get("observedGeneration") == obj.get("metadata", {}).get("generation")
        return current and st.get("phase") == "Ready" and got == counts and st

    try:
        result: dict[str, Any] = cluster.wait_until(f"{name} Ready with {counts}", ready, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{why_not_ready(cluster, ns, name)}") from None
    return result


def why_not_ready(cluster: Cluster, ns: str, name: str = "pd") -> str:
    """What the API server shows when a deployment is not Ready: its status (was it written at
    all, for which generation) and each pod's phase and conditions (probe or serving gate)."""
    obj = get_json(cluster, ns, "pdd", name) or {}
    st = obj.get("status") or {}
    lines = [
        f"generation {obj.get('metadata', {}).get('generation')}, status observedGeneration "
        f"{st.get('observedGeneration')}, phase {st.get('phase')}",
        *(f"  {c.get('type')}={c.get('status')} {c.get('reason')}: {str(c.get('message'))[:200]}"
          for c in st.get("conditions") or []),
    ]  # fmt: skip
    items = (get_json(cluster, ns, "pods", "-l", f"{LABEL_DEPLOYMENT}={name}") or {}).get(
        "items"
    ) or []
    for pod in items:
        pst = pod.get("status") or {}
        conds = ", ".join(f"{c.get('type')}={c.get('status')}" for c in pst.get("conditions") or [])
        lines.append(f"pod {pod['metadata']['name']}: {pst.get('phase')} [{conds}]")
    return "\n".join(lines)


def pods(cluster: Cluster, ns: str, role: str, name: str = "pd") -> list[dict[str, Any]]:
    sel = f"{LABEL_DEPLOYMENT}={name},{LABEL_ROLE}={role}"
    items: list[dict[str, Any]] = get_json(cluster, ns, "pods", "-l", sel)["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def pod_condition(pod: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def admin_token(cluster: Cluster, ns: str, name: str = "pd") -> str:
    secret = get_json(cluster, ns, "secret", f"{name}-admin")
    return base64.b64decode(secret["data"]["token"]).decode()


def router_url(cluster: Cluster, ns: str, name: str = "pd") -> str:
    ip = next(
        p["status"]["podIP"] for p in pods(cluster, ns, "router", name) if p["status"].get("podIP")
    )
    return f"http://{ip}:{WORKER_PORT}"


def generate(cluster: Cluster, ns: str, text: str, name: str = "pd") -> dict[str, Any]:
    code, answer = http(
        "POST", router_url(cluster, ns, name) + "/generate", {"text": text, "max_new_tokens": 4}
    )
    assert isinstance(answer, dict), answer
    answer["http_status"] = code
    return answer


NO_ENDPOINT = "no ready prefill or decode endpoint"  # the router's 503 (pdworker/router.py)


def generate_when_routed(
    cluster: Cluster, ns: str, text: str, name: str = "pd", timeout: float = 20.0
) -> dict[str, Any]:
    """`generate`, once the router lists a ready prefill and decode pod. Right after pods are
    replaced its discovery (refreshed every 2 s) may list none yet and answer 503; any other
    answer is returned as it came, for the test to judge."""

    def routed() -> dict[str, Any]:
        answer = generate(cluster, ns, text, name)
        unrouted = answer["http_status"] == 503 and answer.get("error") == NO_ENDPOINT
        return {} if unrouted else answer  # {}: not yet (falsy), poll again

    return cluster.wait_until("the router to list ready pods", routed, timeout)


def scrape(url: str) -> dict[str, float]:
    """Prometheus text as {name{labels}: value} (our own tiny reader for assertions)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def scraped_sum(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` (exposed name, e.g. with `_total`) at `metrics_url` that
    carry every label value given; AssertionError when there is no such sample (a renamed
    series must fail loudly)."""
    found = [
        value
        for key, value in scrape(metrics_url).items()
        if key.partition("{")[0] == name
        and all(f'{k}="{v}"' in key.partition("{")[2] for k, v in labels.items())
    ]
    assert found, f"{metrics_url} exposes no {name} with {labels}"
    return sum(found)
