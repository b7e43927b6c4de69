"""The documentation names only paths that exist, and the architecture page names every package.

Why a test: a module that moves leaves its old path in prose, and nothing fails until a reader
follows it (issue 33: a restructuring left a dozen dead module paths in docs/). These checks
read README.md, SECURITY.md, bench/README.md and docs/*.md:

* every repository path they name in backticks, in a link or in a mermaid diagram exists: a
  path from the repository root (`operator/...`, `tests/...`), a package-qualified one
  (`pdworker/contract.py`), a package-relative one (`remediation/decide/rungs.py`, found under
  any package of operator/pdwarden or worker/pdworker), a bare file name (`handshake.py`), or a
  dotted module name (`pdwarden.remediation.decide`, `decide.verdicts`, `scrape.client.Share`:
  each module, then the first name defined in it); links resolve from the page that holds
  them, and a link to a heading finds that heading;
* every package of operator/pdwarden is named in docs/architecture.md;
* README.md stays at most README_MAX_LINES lines;
* no two operator modules share a basename (a bare `store.py` in prose then means one file).

URLs, globs (`*`), placeholders (`<name>`, `{a,b}`), flags, absolute container paths
(`/dev/shm`) and command lines are not paths of this repository and are never flagged; a command
line's own path arguments are (`bench/gpu/run.sh --quick` names bench/gpu/run.sh).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = ROOT / "operator" / "pdwarden"
WORKER = ROOT / "worker" / "pdworker"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README_MAX_LINES = 250
TOP_FOLDERS = frozenset(
    {"operator", "worker", "e2e", "bench", "tests", "helm", "docs", "crds", "manifests",
     "scripts", "images"}
)  # fmt: skip
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sh")
# Domains and API groups look dotted (`pdwarden.dev`, `k8s.io`); a module never ends so.
DOMAIN_ENDINGS = frozenset({"dev", "io", "com", "org", "net", "ai", "sh"})
# Characters that make a word a pattern, a placeholder or an assignment, never a path.
NOT_A_PATH = re.compile(r"[<>*{}$=|\[\]@%?!;\\]|\.\.\.")
# A path's line or test suffix: `rules.py:123`, `rules.py:12-40`, `test_x.py::test_y`.
LOCATION = re.compile(r"(::[\w\[\]-]+|:\d+(-\d+)?)+$")

# Paths named by documents this change may not edit, stale until their owner fixes them: each
# entry must still be stale (the test says when it is not, so the entry is removed with the fix).
KNOWN_STALE: dict[tuple[str, str], str] = {}


def documents() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "bench" / "README.md", *docs]


@cache
def package_dirs() -> tuple[Path, ...]:
    """Every package (a directory with __init__.py) of the operator and the worker."""
    return tuple(sorted(p.parent for root in (OPERATOR, WORKER) for p in root.rglob("__init__.py")))


@cache
def repository_files() -> frozenset[str]:
    """Basenames of every file in the repository's own folders."""
    names = set()
    for top in TOP_FOLDERS:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and ".venv" not in path.parts and "__pycache__" not in path.parts:
                names.add(path.name)
    names |= {p.name for p in ROOT.iterdir() if p.is_file()}
    return frozenset(names)


# -- what the documents name ------------------------------------------------------------------

FENCE = re.compile(r"^(```+|~~~+)([^\n]*)\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
WORD = re.compile(r"[A-Za-z0-9_./:-]+")


@dataclass(frozen=True)
class Named:
    line: int
    text: str
    link: bool = False  # a link target: relative to the page, with an optional #heading


def named(markdown: str) -> Iterator[Named]:
    """Everything a page names that may be a path: code spans, link targets and the words of
    mermaid diagrams. Other fenced blocks are shell sessions and output: never read."""
    prose = []
    last = 0
    for block in FENCE.finditer(markdown):
        prose.append((last, markdown[last : block.start()]))
        if block.group(2).strip() == "mermaid":
            start = block.start(3)
            text = block.group(3).replace("<br/>", " ").replace("<br>", " ")
            for word in WORD.finditer(text):
                yield Named(markdown.count("\n", 0, start + word.start()) + 1, word.group())
        last = block.end()
    prose.append((last, markdown[last:]))
    for offset, text in prose:
        for span in CODE_SPAN.finditer(text):
            line = markdown.count("\n", 0, offset + span.start()) + 1
            for word in span.group(2).split():
                yield Named(line, word)
        for link in LINK.finditer(CODE_SPAN.sub("", text)):
            yield Named(0, link.group(1), link=True)


def clean(word: str) -> str:
    """The path in a word, without quotes, brackets, sentence punctuation or a line number."""
    word = word.strip("\"'()[],;").rstrip(".:")
    word = LOCATION.sub("", word)
    return word.removeprefix("./")


# -- whether a named path exists --------------------------------------------------------------


def defines(module: Path, name: str) -> bool:
    """Whether `module` (a .py file or a package's __init__.py) defines or imports `name`."""
    tree = ast.parse(module.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


def module_named(start: Path, parts: list[str]) -> bool:
    """Whether `parts` name a module under the package `start`, then at most a name in it."""
    here = start
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            rest = parts[i + 1 :]
            return not rest or defines(here / f"{part}.py", rest[0])
        return (here / "__init__.py").is_file() and defines(here / "__init__.py", part)
    return True


def dotted_exists(word: str) -> bool | None:
    """A dotted module name's verdict, or None when `word` is not one."""
    parts = word.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return None
    if parts[-1] in DOMAIN_ENDINGS:
        return None
    if parts[0] in ("pdwarden", "pdworker"):
        return module_named((OPERATOR if parts[0] == "pdwarden" else WORKER).parent, parts)
    if parts[1] != parts[1].lower():
        return None  # `remediation.globalDryRun`: a Helm value, not a module
    bases = [d for d in package_dirs() if d.name == parts[0]]
    if not bases:
        return None
    return any(module_named(d.parent, parts) for d in bases)


def file_with_attribute(path: Path) -> bool:
    """`record/store.write`: the module `record/store.py` defines `write`."""
    module, _, attr = path.name.partition(".")
    candidate = path.with_name(f"{module}.py")
    return bool(attr) and attr.isidentifier() and candidate.is_file() and defines(candidate, attr)


def exists(word: str, page: Path, *, link: bool = False) -> bool | None:
    """True or False for a path of this repository, None for anything that is not one."""
    if link:
        if "://" in word or word.startswith(("mailto:", "#")):
            return None
        target = word.partition("#")[0]
        return (page.parent / target).exists()
    if "://" in word or NOT_A_PATH.search(word):
        return None
    word = clean(word)
    if not word or word.startswith(("-", "/", "~", ".")):
        return None
    if (named_in := re.fullmatch(r"(.+\.py):([A-Za-z_]\w*)", word)) is not None:
        # `reconciling/plan.py:apply_waves`: the file, then a name defined in it
        path, attr = named_in.groups()
        return exists(path, page) is not False and exists(f"{path[:-3]}.{attr}", page) is not False
    if "/" not in word:
        if word.endswith(FILE_SUFFIXES):
            return word in repository_files()
        return dotted_exists(word)
    head = word.split("/")[0]
    fileish = word.endswith((*FILE_SUFFIXES, "/")) or "." in word.rsplit("/", 1)[-1]
    if head in TOP_FOLDERS:
        return (ROOT / word).exists() or file_with_attribute(ROOT / word)
    if head in ("pdwarden", "pdworker"):
        base = (OPERATOR if head == "pdwarden" else WORKER).parent
        return (base / word).exists() or file_with_attribute(base / word)
    if head in {d.name for d in package_dirs()} and fileish:
        return any((d.parent / word).exists() or file_with_attribute(d.parent / word)
                   for d in package_dirs() if d.name == head)  # fmt: skip
    # Anything else is someone else's (`srt/environ.py`: SGLang's source, cited) or not a path
    # at all (`pdwarden.dev/serving`, `policy/v1`, `namespace/name`).
    return None


def stale_paths(page: Path, markdown: str) -> list[str]:
    rel = page.relative_to(ROOT).as_posix()
    out = []
    for item in named(markdown):
        verdict = exists(item.text, page, link=item.link)
        if verdict is False and (rel, clean(item.text)) not in KNOWN_STALE:
            where = f"{rel}:{item.line}" if item.line else f"{rel} (link)"
            out.append(f"{where}: {item.text if item.link else clean(item.text)}")
    return out


# -- links to headings ------------------------------------------------------------------------

HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, -1 on repeats."""
    seen: Counter[str] = Counter()
    out = set()
    for heading in HEADING.finditer(FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def broken_anchors(page: Path, markdown: str) -> list[str]:
    out = []
    for item in named(markdown):
        if not item.link or "://" in item.text or "#" not in item.text:
            continue
        target, _, anchor = item.text.partition("#")
        if not target:
            headings = anchors(markdown)
        elif (file := page.parent / target).suffix == ".md" and file.is_file():
            headings = anchors(file.read_text())
        else:
            continue
        if anchor not in headings:
            out.append(f"{page.relative_to(ROOT)}: {item.text}")
    return out


# -- the checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page: Path) -> None:
    stale = stale_paths(page, page.read_text())
    assert stale == [], "paths that do not exist (moved? renamed?):\n" + "\n".join(stale)


@pytest.mark.parametrize("page", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_heading_finds_it(page: Path) -> None:
    broken = broken_anchors(page, page.read_text())
    assert broken == [], "links to headings that do not exist:\n" + "\n".join(broken)


def test_known_stale_entries_are_still_stale() -> None:
    fixed = [
        f"{doc}: {path} ({why})"
        for (doc, path), why in KNOWN_STALE.items()
        if exists(path, ROOT / doc) is not False or path not in (ROOT / doc).read_text()
    ]
    assert fixed == [], "fixed or gone: drop these from KNOWN_STALE:\n" + "\n".join(fixed)


def test_every_operator_package_is_named_on_the_architecture_page() -> None:
    text = ARCHITECTURE.read_text()
    missing = []
    for package in package_dirs():
        if OPERATOR not in (package, *package.parents) or package == OPERATOR:
            continue
        parts = package.relative_to(OPERATOR).parts
        body = "[/.]".join(map(re.escape, parts))
        qualified = rf"(?<![\w./-])(?:operator/)?pdwarden[/.]{body}(?![\w-])"
        relative = rf"(?<![\w./-]){body}" + (r"/" if len(parts) == 1 else r"(?![\w-])")
        if not re.search(qualified, text) and not re.search(relative, text):
            missing.append("/".join(parts))
    assert missing == [], "packages docs/architecture.md does not name: " + ", ".join(missing)


def test_readme_stays_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_every_operator_module_basename_is_unique() -> None:
    names = Counter(p.name for p in OPERATOR.rglob("*.py") if p.name != "__init__.py")
    twice = sorted(
        str(p.relative_to(OPERATOR))
        for p in OPERATOR.rglob("*.py")
        if p.name != "__init__.py" and names[p.name] > 1
    )
    assert twice == [], "operator modules sharing a basename: " + ", ".join(twice)


def test_the_check_flags_stale_paths_but_not_urls_globs_placeholders_or_commands() -> None:
    page = ROOT / "docs" / "example.md"
    markdown = "\n".join(
        [
            "Stale: `remediation/views.py`, `operator/pdwarden/render/vllm.py:12`,",
            "`act/sglang.py`, `scrape.client.Share`, `pdwarden.remediation.policy.plan`,",
            "`views.py`, [a](gone.md), `bench/gpu/run.sh --out bench/gpu/gone.sh`,",
            "[b](architecture.md#no-such-heading), [c](#no-such-heading-here).",
            "## Fine headings",
            "Fine: `remediation/decide/rungs.py`, `pdworker/contract.py`, `record/store.write`,",
            "`decode/prefill_link.py::PrefillLink`, `pdwarden.remediation.decide.plan`,",
            "`rules.py`, `decide.verdicts`, [d](#fine-headings), [e](../README.md),",
            "`reconciling/plan.py:to_apply`,",
            "`https://x.dev/a/b.py`, `tests/*/test_x.py`, `engines/<name>.py`, `/dev/shm`,",
            "`--set shard=I/N`, `pdwarden.dev/serving`, `k8s.io`, `remediation.globalDryRun`,",
            "`srt/environ.py:12`, `policy/v1`, `make crd`, `python -m bench.kv_storm`.",
            "```console",
            "$ cat remediation/views.py",
            "```",
            "```mermaid",
            'flowchart LR\n  A["reconciling/resync.py<br/>k8s/events.py"]',
            "```",
        ]
    )
    found = sorted(s.split(": ", 1)[1] for s in stale_paths(page, markdown))
    assert found == [
        "act/sglang.py",
        "bench/gpu/gone.sh",
        "gone.md",
        "k8s/events.py",
        "operator/pdwarden/render/vllm.py",
        "pdwarden.remediation.policy.plan",
        "remediation/views.py",
        "scrape.client.Share",
        "views.py",
    ]
    assert broken_anchors(page, markdown) == [
        "docs/example.md: architecture.md#no-such-heading",
        "docs/example.md: #no-such-heading-here",
    ]
