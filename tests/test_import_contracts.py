"""The operator-imports-only-the-contract rule names every worker module, new ones included.

import-linter's `forbidden` contract lists modules one by one: a worker module added later and
not listed would be importable by the operator without a word. This keeps the list whole.
"""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"contract"}  # what the operator may import of the worker


def test_every_worker_module_but_the_contract_is_forbidden_to_the_operator() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    section = config["importlinter:contract:operator-uses-worker-contract-only"]
    forbidden = set(section["forbidden_modules"].split())
    package = ROOT / "worker" / "pdworker"
    modules = {
        p.stem if p.is_file() else p.name
        for p in package.iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and not p.name.startswith("__")
    }
    assert modules - PUBLIC, "no worker modules found"
    missing = sorted(m for m in modules - PUBLIC if f"pdworker.{m}" not in forbidden)
    assert not missing, f"add to .importlinter's forbidden_modules: {missing}"
