"""The benchmarks' shared tail (`bench.common.finish`): JSON, README row, PNG, in-process.

The quick runs in test_bench_quick.py cover the happy path end to end; these cover what they
cannot reach: a machine without matplotlib, and kv_transfer --short's README row.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import common


def _readme(tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(f"# results\n\n{common.TABLE_START}\n{common.TABLE_END}\ntail\n")
    return readme


def test_finish_writes_json_png_and_row(tmp_path: Path) -> None:
    readme = _readme(tmp_path)

    def plot(path: Path) -> None:
        with common.figure(path, figsize=(3, 2), dpi=50) as ax:
            ax.plot([1, 2], [3, 4], label="x")
            common.label(ax, "x", "y", "t")

    path = common.finish(tmp_path, "demo", False, readme, {"k": 1}, "1 thing", plot)
    doc = json.loads(path.read_text())
    assert path.name == "demo.json"
    assert doc["benchmark"] == "demo" and doc["mode"] == "full" and doc["k"] == 1
    assert doc["summary"] == "1 thing" and "no_plot" not in doc
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert "| demo | full |" in readme.read_text() and readme.read_text().endswith("tail\n")


def test_no_matplotlib_still_writes_the_numbers(tmp_path: Path) -> None:
    def plot(path: Path) -> None:
        raise ImportError("No module named 'matplotlib'")

    path = common.finish(tmp_path, "demo", True, None, {"k": 2}, "2 things", plot)
    doc = json.loads(path.read_text())
    assert path.name == "demo-quick.json" and doc["mode"] == "quick" and doc["k"] == 2
    assert "matplotlib" in doc["no_plot"]
    assert not (tmp_path / "demo-quick.png").exists()


def test_readme_mode_names_the_row_not_the_json(tmp_path: Path) -> None:
    readme = _readme(tmp_path)
    common.finish(tmp_path, "kv", False, readme, {}, "short figures", lambda p: None, "short")
    assert json.loads((tmp_path / "kv.json").read_text())["mode"] == "full"
    rows = [ln for ln in readme.read_text().splitlines() if ln.startswith("| kv |")]
    assert len(rows) == 1 and rows[0].startswith("| kv | short |"), rows
