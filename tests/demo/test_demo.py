"""`make demo` end to end on the session's cluster, and `pdwarden demo` handing over to it.

The demo runs as its users run it (`python -m e2e.demo`, a subprocess) with KUBECONFIG pointing
at the session cluster, so it installs the chart and its PDDeployment in its own namespace and
must leave that namespace gone when it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.fixtures import Cluster

from pdwarden import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_wedges_repairs_and_reports(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "demo-output"
    env = {k: v for k, v in cluster.env.items() if k != "PDWARDEN_DEMO_KEEP"}
    run = subprocess.run(
        [sys.executable, "-m", "e2e.demo", "--output", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=840, check=False,
    )  # fmt: skip
    log = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, log
    assert "KUBECONFIG is set" in run.stdout

    png = (out / "timeline.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 20_000, len(png)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recovered"] is True, summary["problems"]
    actions = summary["actions"]
    assert actions.get("FailRooms", 0) >= 1, actions
    assert actions.get("CordonDecode", 0) >= 1 and actions.get("RestartDecode", 0) >= 1, actions
    assert summary["load"]["completed"] > 0
    # It cleaned up after itself: its namespace is gone, so it can run again.
    ns = cluster.kubectl("get", "namespace", "pdwarden-demo", check=False)
    assert ns.returncode != 0, ns.stdout


def test_pdwarden_demo_hands_over_to_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], str]] = []

    class Exec(Exception):
        pass

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv, os.getcwd()))
        raise Exec

    monkeypatch.setattr(os, "execv", fake_execv)
    monkeypatch.chdir(REPO_ROOT / "tests")
    with pytest.raises(Exec):
        cli.main(["demo"])
    assert calls == [(sys.executable, [sys.executable, "-m", "e2e.demo"], str(REPO_ROOT))]


def test_each_operator_event_is_told_once_on_one_line() -> None:
    from e2e.demo_observe import event_line

    message = "CordonDecode demo-decode-0: decode stalled"
    first = event_line("CordonDecode", message, first=True)
    again = event_line("CordonDecode", message, first=False)
    assert first == (
        "Event CordonDecode: operator CORDONED the decode pod (readiness gate False: no new "
        "work): demo-decode-0: decode stalled"
    )
    assert again == "Event CordonDecode: demo-decode-0: decode stalled"
    for line in (first, again):
        assert "\n" not in line and line.count("CordonDecode") == 1
    # A message that does not repeat the reason is kept whole.
    wedge = "DecodeStalled on demo-decode-0: transfer queue 3"
    assert event_line("WedgeDetected", wedge, first=False) == f"Event WedgeDetected: {wedge}"


@pytest.mark.parametrize(("engine", "name"), [("vllm", "vLLM"), ("sglang", "SGLang")])
def test_a_real_engine_demo_refuses_a_remote_cluster_before_touching_it(
    engine: str, name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real-engine stories freeze the pods' processes on this machine: with KUBECONFIG set
    they say why they cannot run and exit 2, having acquired nothing."""
    from e2e import demo

    def untouched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo acquired a cluster")

    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.setattr(demo, "acquire_cluster", untouched)
    assert demo.main(["--engine", engine]) == 2
    out = capsys.readouterr().out
    assert f"the {name} demo signals the pods' processes on this machine" in out
    assert "unset KUBECONFIG" in out
