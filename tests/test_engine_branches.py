"""No engine branches outside engines/, and no module too long to read: AST- and line-checked.

Why a test: the renderer, the scrape parser, detection, the plan and the confirm stage differ per
engine only in what `pdwarden.engines.Engine` asks; they call `engines.get(spec.engine)` and never
ask an engine's name. A branch on the name (`engine == "vllm"`, `engine in ("sglang", "vllm")`,
a dict or set keyed by names) is a second registry that a new engine silently falls through.
Exempt: operator/pdwarden/engines/ (each engine's own module, and the registry) and
operator/pdwarden/api/, where the CRD schema's CEL rules (`self.engine != 'sglang' || ...`), the
pydantic checks that mirror them and the `Engine` Literal must name engines: that is the API.

Modules stay short (STYLE.md 9, median around 150 lines): a non-test module over
`MAX_MODULE_LINES` is named here so it is split before it grows further.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

from pdwarden.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = Path("operator/pdwarden")
EXEMPT = (OPERATOR / "engines", OPERATOR / "api")
NAMES = frozenset({"pdworker", "sglang", "vllm"} | set(ENGINES))
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
MAX_MODULE_LINES = 400
# Not modules of the project: virtual environments, caches, generated and installed copies.
SKIPPED_DIRS = {"tests", "__pycache__", "node_modules", "build", "dist", "demo-output"}


def _names_in(node: ast.AST) -> list[str]:
    """The engine names `node` is, or holds as a literal tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for e in node.elts for n in _names_in(e)]
    return []


def branches(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each comparison to an engine name, and each dict key, set member or
    match case that is one."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(o, COMPARISONS) for o in node.ops):
            for operand in (node.left, *node.comparators):
                for name in _names_in(operand):
                    yield node.lineno, f"compares to {name!r}"
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None:
                    for name in _names_in(key):
                        yield node.lineno, f"{name!r} as a dict key"
        elif isinstance(node, ast.Set):
            for name in _names_in(node):
                yield node.lineno, f"{name!r} in a set"
        elif isinstance(node, ast.MatchValue):
            for name in _names_in(node.value):
                yield node.lineno, f"case {name!r}"
        elif isinstance(node, ast.Subscript):
            literal = ast.unparse(node.value).rsplit(".", 1)[-1] == "Literal"
            for name in _names_in(node.slice):  # a Literal of names is a second list of them
                yield node.lineno, f"{name!r} in a Literal" if literal else f"[{name!r}] as a key"


def _operator_modules() -> Iterator[Path]:
    for path in sorted((ROOT / OPERATOR).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if not any(rel.is_relative_to(e) for e in EXEMPT):
            yield rel


def test_the_check_sees_each_kind_of_branch() -> None:
    source = """
if spec.engine == "vllm": pass
if "sglang" != engine: pass
if engine in ("sglang", "vllm"): pass
if engine not in {"pdworker"}: pass
TABLE = {"pdworker": 1}
handler = TABLE["sglang"]
match engine:
    case "vllm": pass
label = {"app": "pdworker"}  # a value, not a key: not a branch
default: str = "pdworker"  # a default, not a branch
Kind = Literal["sglang", "other"]
"""
    assert sorted({line for line, _ in branches(source)}) == [2, 3, 4, 5, 6, 7, 9, 12]


def test_no_module_outside_engines_and_api_branches_on_an_engine_name() -> None:
    modules = list(_operator_modules())
    assert len(modules) > 50  # the walk found the operator
    offenders = [
        f"{rel}:{line}: {what}"
        for rel in modules
        for line, what in branches((ROOT / rel).read_text())
    ]
    assert offenders == [], "ask pdwarden.engines.get(name) instead:\n" + "\n".join(offenders)


def _project_modules() -> Iterator[Path]:
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d for d in dirs
            if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")
        )  # fmt: skip
        for f in sorted(files):
            if f.endswith(".py") and not f.startswith("test_") and f != "conftest.py":
                yield (Path(top) / f).relative_to(ROOT)


def test_no_module_is_longer_than_the_limit() -> None:
    modules = list(_project_modules())
    tops = {rel.parts[0] for rel in modules}
    assert {"operator", "worker", "e2e", "bench"} <= tops, tops  # scripts/ too, when it has any
    lengths = {rel: len((ROOT / rel).read_text().splitlines()) for rel in modules}
    offenders = [f"{rel}: {n} lines" for rel, n in sorted(lengths.items()) if n > MAX_MODULE_LINES]
    assert offenders == [], f"split these below {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders)
