"""The defaults the remediation page tabulates are the API's own.

Why a test: a default changed in the pydantic model (the CRD is generated from it) leaves the
old value in docs/remediation.md, and a user tuning from that table tunes from a number that is
no longer true (the pair canary's leg deadline went from 8 s to 4 s). Each table whose header is
`| field ... | default | meaning |` is read: `(`spec.remediation.canary`)` in the header names
the section, none means `spec.remediation`; every row's default must be what
`RemediationSpec()` gives that field, and every field of the section must have a row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pdwarden.api import RemediationSpec

PAGE = Path(__file__).resolve().parents[1] / "docs" / "remediation.md"
HEADER = re.compile(
    r"^\| field(?: \(`spec\.remediation(?P<section>\.[a-zA-Z]+)?`\))? \| default \|"
)


def tables(text: str) -> dict[str, dict[str, str]]:
    """section ("" or "canary") -> field -> the default cell, as written."""
    out: dict[str, dict[str, str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = HEADER.match(line)
        if m is None:
            continue
        section = (m.group("section") or "").lstrip(".")
        rows = out.setdefault(section, {})
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1]
    return out


def written(value: Any) -> str:
    """A default as the page writes it: code spans for names, bare numbers."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return ", ".join(f"`{v}`" for v in value)
    if isinstance(value, str):
        return f"`{value}`"
    return str(value)


def test_every_tabulated_default_is_the_apis_and_every_field_has_a_row() -> None:
    found = tables(PAGE.read_text())
    defaults = RemediationSpec().model_dump(by_alias=True, mode="json")
    assert set(found) == {"", "canary"}, found.keys()
    for section, rows in found.items():
        model = defaults[section] if section else defaults
        scalars = {k: v for k, v in model.items() if not isinstance(v, dict)}
        assert set(rows) == set(scalars), (section, set(rows) ^ set(scalars))
        for field, cell in rows.items():
            assert cell == written(scalars[field]), (section, field, cell, scalars[field])


def test_the_check_reads_a_wrong_default_as_wrong() -> None:
    page = "| field (`spec.remediation.canary`) | default | meaning |\n|---|---|---|\n"
    stale = tables(page + "| `deadlineSeconds` | 8 | how long each leg may take |\n")
    assert stale == {"canary": {"deadlineSeconds": "8"}}
    assert written(RemediationSpec().canary.deadline_seconds) != "8"
