"""Helpers for the install tests: run the pinned helm on helm/pdwarden and parse what it renders."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "pdwarden"
# The Kubernetes version templates are rendered for (the local cluster's), explicit so renders do
# not depend on the helm binary; build.sh stamps the same into helm's default.
KUBE_VERSION = "1.35.4"


@dataclass
class Helm:
    path: str

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.path, *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        # helm warns on stderr about the symlinked crds/ (they are followed, on purpose).
        out.stderr = "\n".join(line for line in out.stderr.splitlines() if "walk.go" not in line)
        return out

    def template(self, *args: str, release: str = "pdw", namespace: str = "pdw-system") -> str:
        out = self.run(
            "template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION, *args
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def objects(self, *args: str, **kw: str) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.template(*args, **kw)) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def operator_args(objs: list[dict[str, Any]]) -> list[str]:
    (dep,) = find(objs, "Deployment")
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args
