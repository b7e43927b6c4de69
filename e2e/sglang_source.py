"""SGLang 0.5.23's own source, fetched from PyPI, as the reference the simulator is checked against.

Why: SGLang needs a GPU, so it cannot run here; its source is the authority. Tests that compare
the simulator (e2e/sglang_sim.py) or pdwarden's limits with what a real server exposes read the
metric definitions straight out of `sglang/srt/observability/metrics_collector.py` of the
published wheel, instead of trusting a copy. The wheel is fetched once with pip's ordinary client
(`pip download --no-deps`), only the files needed are unpacked into the pdwarden cache, and
nothing of SGLang is imported or run: the definitions are read with `ast`. A test skips with a
clear message only when the registry cannot be reached.
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "0.5.23"
CACHE = Path(os.environ.get("PDWARDEN_CACHE", Path.home() / ".cache" / "pdwarden"))
WANTED = ("sglang/srt/observability/", "sglang/srt/arg_groups/fields/")
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
KINDS = ("Gauge", "Counter", "Histogram", "Summary", "GaugeHistogram")
DOWNLOAD_TIMEOUT = 600.0


class SourceUnavailable(RuntimeError):
    """The wheel could not be fetched (registry unreachable, pip failed)."""


def source_dir() -> Path:
    """The unpacked parts of the sglang wheel (cached); raises SourceUnavailable."""
    root = CACHE / f"sglang-{VERSION}-src"
    if (root / COLLECTOR).is_file():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"sglang=={VERSION}", "-d", tmp]  # fmt: skip
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SourceUnavailable(f"pip download sglang=={VERSION}: {e}") from None
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if done.returncode != 0 or not wheels:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SourceUnavailable(
                f"pip download sglang=={VERSION} failed (registry unreachable?): {' | '.join(tail)}"
            )
        unpacked = Path(tmp) / "src"
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                if member.startswith(WANTED) and member.endswith(".py"):
                    wheel.extract(member, unpacked)
        shutil.rmtree(root, ignore_errors=True)
        unpacked.rename(root)
    return root


@dataclass(frozen=True)
class MetricDef:
    """One metric constructor call in metrics_collector.py."""

    owner: str  # the collector class it belongs to
    kind: str  # Gauge, Counter, Histogram, Summary, GaugeHistogram
    name: str  # as given to the constructor (counters keep their `_total`)
    collector_labels: bool  # labelnames start with the collector's own labels
    extra_labels: tuple[str, ...]
    buckets: tuple[float, ...] | None  # None: not resolvable from the source alone
    multiprocess_mode: str | None
    documentation: str
    line: int
    condition: str | None = None  # the `if` it is created under, if any

    @property
    def exposed(self) -> str:
        """The family name prometheus-client exposes (counters lose a trailing `_total`)."""
        if self.kind == "Counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


def _literal(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "exponential_buckets":  # observability/utils.py:52-56
            kw = {k.arg: _literal(k.value, env) for k in node.keywords}
            args = [_literal(a, env) for a in node.args]
            start, width, length = (*args, *(kw[k] for k in ("start", "width", "length")))[:3]
            return [start * width**i for i in range(length)]
        if node.func.id == "generate_buckets":  # utils.py:34-47, the "default" rule
            return sorted(set(_literal(node.args[1], env)))
    return ast.literal_eval(node)


def _labels(node: ast.AST) -> tuple[bool, tuple[str, ...]]:
    """(starts with the collector's labels, the extra label names) of a labelnames expr."""
    text = ast.unparse(node)
    own = "labels.keys()" in text
    extra: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            extra.append(sub.value)
    return own, tuple(extra)


def _doc(node: ast.AST | None) -> str:
    if node is None:
        return ""
    try:
        return str(ast.literal_eval(node))
    except ValueError:
        return ast.unparse(node)  # an f-string: its length is close enough for sizing


def definitions(root: Path | None = None) -> list[MetricDef]:
    """Every metric metrics_collector.py defines, in source order."""
    path = (root or source_dir()) / COLLECTOR
    tree = ast.parse(path.read_text())
    out: list[MetricDef] = []

    def visit(node: ast.AST, owner: str, env: dict[str, Any], cond: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            o, c = owner, cond
            if isinstance(child, ast.ClassDef):
                o, env = child.name, dict(env)
            if isinstance(child, ast.If):
                c = ast.unparse(child.test)
            if isinstance(child, ast.Assign) and len(child.targets) == 1:
                target = child.targets[0]
                if isinstance(target, ast.Name):
                    with contextlib.suppress(ValueError, TypeError, KeyError, SyntaxError):
                        env[target.id] = _literal(child.value, env)
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in KINDS
            ):
                out.extend(_definition(child, o, env, c))
            visit(child, o, env, c)

    visit(tree, "", {}, None)
    return out


def _definition(
    call: ast.Call, owner: str, env: dict[str, Any], cond: str | None
) -> Iterator[MetricDef]:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    name_node = kw.get("name") or (call.args[0] if call.args else None)
    if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
        return
    own, extra = _labels(kw["labelnames"]) if "labelnames" in kw else (False, ())
    bucket_node = kw.get("buckets") or kw.get("bucket_bounds")
    buckets = None
    if bucket_node is not None:
        try:
            buckets = tuple(float(b) for b in _literal(bucket_node, env))
        except (ValueError, TypeError, KeyError, SyntaxError):
            buckets = None
    mode = kw.get("multiprocess_mode")
    yield MetricDef(
        owner=owner, kind=call.func.id, name=name_node.value,  # type: ignore[attr-defined]
        collector_labels=own, extra_labels=extra, buckets=buckets,
        multiprocess_mode=mode.value if isinstance(mode, ast.Constant) else None,
        documentation=_doc(kw.get("documentation")), line=call.lineno, condition=cond,
    )  # fmt: skip


def by_exposed_name(defs: list[MetricDef]) -> dict[str, MetricDef]:
    return {d.exposed: d for d in defs}
