"""`pdwarden status`: the pure formatter on realistic objects, and the CLI's errors without a
cluster (a bad kubeconfig; a stand-in API server that answers like kube-apiserver)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import status_examples as ex

from pdwarden.cli import main
from pdwarden.cli.status_view import WIDTH, format_status, status_json


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_wedged_view_shows_pools_wedges_evidence_actions_and_breaker() -> None:
    text = format_status(ex.wedged(), now=ex.NOW)
    out = lines(text)
    assert out[0].startswith("PDDeployment serving/demo   phase Wedged")
    assert "remediation Enforce" in out[0]
    assert "decode   3      4        4        1" in out  # ready, desired, updated, cordoned
    assert "prefill  2      2        2        -" in out
    assert any(
        line.startswith("Wedged                True    WedgesFound     1m35s") for line in out
    )
    assert "WEDGES (3 findings, 3 wedged rooms)" in out
    row = next(i for i, line in enumerate(out) if line.startswith("demo-prefill-0  prefill"))
    assert out[row].split() == [
        "demo-prefill-0", "prefill", "InflightStuck", "2", "92.4s", "demo-decode-2", "35s",
    ]  # fmt: skip
    assert out[row + 1] == f"  evidence: {ex.STUCK_EVIDENCE}"
    assert "evidence: prealloc queue 0, transfer queue 2" in text
    assert "RECENT ACTIONS (newest first, 10 of 11)" in out
    actions = out[out.index("RECENT ACTIONS (newest first, 10 of 11)") + 2 :]
    assert actions[0].split()[:6] == [
        "4s",
        "RestartDecode",
        "demo-decode-3",
        "-",
        "Succeeded",
        "yes",
    ]
    assert actions[4].split()[:6] == ["5s", "FailRooms", "demo-prefill-1", "1", "Failed", "no"]
    assert "45m    FailRooms" in actions[7]
    assert "48m" in actions[9] and "51m" not in text  # only the last 10
    assert "BREAKER: closed (6 of 20 actions in the last hour)" in out
    assert "cordoned now: demo-decode-2 (for 1m35s)" in text
    assert "CANARIES: 42 sent, 80 requests to pods, 31.2s waited on answers, since 1h0m ago" in out


def test_every_line_fits_a_100_column_terminal() -> None:
    for obj in (ex.wedged(), ex.suspended(), ex.new()):
        for now in (ex.NOW, None):
            for line in lines(format_status(obj, now=now)):
                assert len(line) <= WIDTH, line


def test_long_cells_are_cut_not_wrapped() -> None:
    obj = ex.wedged()
    obj["status"]["remediation"]["history"][-1]["reason"] = "x" * 300
    text = format_status(obj, now=ex.NOW)
    assert "x" * 20 in text and "x" * 300 not in text and "..." in text


def test_open_breaker_says_how_to_reset_it() -> None:
    text = format_status(ex.suspended(), now=ex.NOW)
    assert "BREAKER: OPEN, remediation suspended (20 of 20 actions in the last hour)" in text
    assert "kubectl annotate pdd demo -n serving pdwarden.dev/reset-breaker=now" in " ".join(
        text.split()
    )
    assert "last reset: 2h0m ago" in text


def test_without_a_clock_times_are_timestamps() -> None:
    text = format_status(ex.wedged())
    assert "2025-06-01 11:59:25" in text and " AGE " not in text


def test_new_object_without_status() -> None:
    text = format_status(ex.new(), now=ex.NOW)
    assert "phase Unknown" in text and "remediation DryRun" in text
    assert "No status yet" in text
    assert "decode   -      4        -        -" in lines(text)
    assert "WEDGES: none" in text and "RECENT ACTIONS: none" in text
    assert "BREAKER: closed (0 of 20 actions in the last hour)" in text


def test_evidence_is_not_misattributed() -> None:
    """If the Wedged message does not line up with status.wedges, show no evidence at all."""
    obj = ex.wedged()
    wedges = obj["status"]["wedges"]
    wedges.append(wedges.pop(0))
    assert "evidence:" not in format_status(obj, now=ex.NOW)


def test_json_output() -> None:
    doc = json.loads(status_json(ex.wedged()))
    assert doc["name"] == "demo" and doc["namespace"] == "serving"
    assert doc["remediation"]["mode"] == "Enforce"
    assert doc["status"]["wedgedRooms"] == 3
    assert json.loads(status_json(ex.new()))["status"] == {}


# -- the CLI, without a cluster ------------------------------------------------------------


def test_cli_bad_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["status", "demo", "--kubeconfig", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pdwarden status: cannot load a kubeconfig from")
    assert "--kubeconfig PATH" in err
    garbage = tmp_path / "garbage"
    garbage.write_text("this: [is not a kubeconfig")
    assert main(["status", "demo", "--kubeconfig", str(garbage)]) == 1
    assert "cannot load a kubeconfig" in capsys.readouterr().err


class _FakeApiServer(BaseHTTPRequestHandler):
    objects: dict[str, dict[str, Any]] = {}

    def do_GET(self) -> None:
        prefix = "/apis/pdwarden.dev/v1alpha1/namespaces/"
        if not self.path.startswith(prefix) or "/pddeployments/" not in self.path:
            msg = "the server could not find the requested resource"
            return self._send(404, {"kind": "Status", "code": 404, "message": msg})
        name = self.path.rsplit("/", 1)[1]
        if name in self.objects:
            return self._send(200, self.objects[name])
        msg = f'pddeployments.pdwarden.dev "{name}" not found'
        return self._send(404, {"kind": "Status", "code": 404, "message": msg})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = HTTPServer(("127.0.0.1", 0), _FakeApiServer)
    _FakeApiServer.objects = {"demo": ex.wedged()}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip
    yield path
    server.shutdown()
    server.server_close()


def test_cli_object_not_found(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "ghost", "-n", "serving", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert 'PDDeployment "ghost" not found in namespace "serving"' in err
    assert "kubectl get pdd -A" in err


def test_cli_prints_the_table_and_json(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "demo", "-n", "serving", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PDDeployment serving/demo") and "WEDGES (3 findings" in out
    argv = ["status", "demo", "-n", "serving", "--kubeconfig", str(kubeconfig), "-o", "json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["status"]["phase"] == "Wedged"


def test_cli_unreachable_api_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip
    assert main(["status", "demo", "--kubeconfig", str(path)]) == 1
    assert "cannot reach the API server at http://127.0.0.1:9" in capsys.readouterr().err
