"""Packaging smoke tests: the console scripts work and `operator/` never shadows the stdlib."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB_CHECK = "import operator, kopf; print(operator.__file__, operator.eq(1, 1))"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, check=False, capture_output=True, text=True, timeout=120)


def test_import_operator_from_repo_root_is_the_standard_library() -> None:
    out = run(sys.executable, "-c", STDLIB_CHECK)
    assert out.returncode == 0, out.stderr
    assert "site-packages" not in out.stdout
    assert str(ROOT / "operator") not in out.stdout
    assert out.stdout.strip().endswith("True")


def test_no_operator_init_file() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()


@pytest.mark.parametrize("script", ["pdwarden", "pdworker"])
def test_console_script_help(script: str) -> None:
    exe = shutil.which(script, path=str(Path(sys.executable).parent))
    assert exe, f"{script} is not installed in the venv"
    out = run(exe, "--help")
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


@pytest.mark.parametrize("script", ["pdwarden", "pdworker"])
def test_unknown_option_is_a_clear_error(script: str) -> None:
    exe = shutil.which(script, path=str(Path(sys.executable).parent))
    assert exe
    for argv in (["--no-such-option"], ["--help-me"], ["no-such-command"]):
        out = run(exe, *argv)
        assert out.returncode == 2, argv
        assert "error:" in out.stderr
        assert argv[0] in out.stderr, out.stderr
