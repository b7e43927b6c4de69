"""What the control-plane fault tests (e2e/tests/test_control_plane_faults.py) need besides the
shared fixtures: a direct reader of the API, etcd's own compaction, and the operator's identity
throttled by API Priority and Fairness, beside a neighbour that can take every seat it has.

Why apart: a fault test times recoveries to a second or better, and a `kubectl` process per poll
costs half of that on a loaded 2-core box; the reader polls over one HTTPS connection per call
with the admin token instead. Compaction goes through etcd's v3 JSON gateway (no etcdctl is
built), and the throttled identity is the chart's own (e2e.apicount), moved onto a priority
level of the smallest share (3 seats on the local API server) that rejects instead of queueing.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.apicount import Kubectl, OperatorIdentity
from pdwarden.constants import API_VERSION, PLURAL

Obj = dict[str, Any]


class Reader:
    """GETs against the API server with the admin kubeconfig's token; None when the object is
    missing or the server does not answer (a fault test polls through outages)."""

    def __init__(self, kubeconfig: str | Path) -> None:
        config = json.loads(Path(kubeconfig).read_text())
        cluster = config["clusters"][0]["cluster"]
        self.server = str(cluster["server"])
        self.token = str(config["users"][0]["user"]["token"])
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        self.ctx = ssl.create_default_context(cadata=ca)

    def get(self, path: str, timeout: float = 5.0) -> Obj | None:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as resp:
                data: Obj = json.loads(resp.read())
                return data
        except (OSError, ValueError):  # HTTPError (404, 5xx) is an OSError too
            return None

    def text(self, path: str) -> str:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as resp:
            return str(resp.read().decode())

    def ready(self) -> bool:
        try:
            return self.text("/readyz") == "ok"
        except OSError:
            return False

    def pod(self, ns: str, name: str) -> Obj | None:
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def pdd(self, ns: str, name: str, timeout: float = 5.0) -> Obj | None:
        return self.get(f"/apis/{API_VERSION}/namespaces/{ns}/{PLURAL}/{name}", timeout)


def wait(what: str, check: Any, timeout: float, every: float = 0.1) -> tuple[Any, float]:
    """Poll `check()` until truthy; (its value, monotonic time it was first seen)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last, time.monotonic()
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


# -- etcd ------------------------------------------------------------------------------------


def _etcd(url: str, path: str, body: Obj) -> Obj:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            data: Obj = json.loads(resp.read())
            return data
    except urllib.error.HTTPError as e:
        data = json.loads(e.read() or b"{}")
        return {"error": data.get("message") or data.get("error") or str(e)}


def etcd_revision(url: str) -> int:
    """etcd's current revision (every write of every object advances it)."""
    return int(
        _etcd(url, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"]
    )


def etcd_compact(url: str) -> int:
    """Compact etcd's history up to now (physically): every older revision is gone, as after
    the API server's own periodic compaction. Returns the revision compacted to, after proving
    that reading just before it fails."""
    revision = etcd_revision(url)
    out = _etcd(url, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    assert "error" not in out, out
    older = _etcd(url, "/v3/kv/range", {"key": base64.b64encode(b"/").decode(),
                                         "revision": str(revision - 1)})  # fmt: skip
    assert "compacted" in str(older.get("error")), older
    return revision


# -- API Priority and Fairness ---------------------------------------------------------------

LEVEL = "pdwarden-faults-tiny"


class ThrottledIdentity(OperatorIdentity):
    """The chart's ServiceAccount and RBAC for the operator (no request counting). `throttle`
    moves its requests (and a neighbour's, `neighbour`) onto one priority level of the smallest
    share that rejects (429) whatever finds its seats taken; `unthrottle` takes that back. The API
    server counts what it dispatched and rejected per schema (`requests`)."""

    neighbour = "pdwarden-faults-neighbour"

    @property
    def schema(self) -> str:
        return f"{self.prefix}-operator"

    @property
    def neighbour_schema(self) -> str:
        return f"{self.prefix}-neighbour"

    def flow_schemas(self) -> list[Obj]:
        return []  # none at create: the operator runs unthrottled until `throttle`

    def throttling(self) -> list[Obj]:
        level = {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
            "metadata": {"name": f"{self.prefix}-{LEVEL}"},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"}}},
        }  # fmt: skip
        neighbour = {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": self.neighbour, "namespace": self.namespace},
        }
        mine = {"kind": "ServiceAccount",
                "serviceAccount": {"name": self.sa, "namespace": self.namespace}}  # fmt: skip
        return [
            level,
            self._on(self.schema, 10, mine),
            self._on(self.neighbour_schema, 11, neighbour),
        ]

    def throttle(self) -> None:
        items = self.throttling()
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": items}))  # fmt: skip

    def unthrottle(self) -> None:
        for obj in reversed(self.throttling()):
            self.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found",
                         "--wait=false", check=False)  # fmt: skip

    def _on(self, name: str, precedence: int, subject: Obj) -> Obj:
        every = [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                  "namespaces": ["*"]}]  # fmt: skip
        return {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {"matchingPrecedence": precedence,
                     "priorityLevelConfiguration": {"name": f"{self.prefix}-{LEVEL}"},
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [subject], "resourceRules": every,
                                "nonResourceRules": [{"verbs": ["*"],
                                                      "nonResourceURLs": ["*"]}]}]},
        }  # fmt: skip

    def neighbour_token(self) -> str:
        self.kubectl("create", "serviceaccount", self.neighbour, "-n", self.namespace,
                     check=False)  # fmt: skip
        self.kubectl("create", "rolebinding", self.neighbour, "-n", self.namespace,
                     "--clusterrole=view", f"--serviceaccount={self.namespace}:{self.neighbour}",
                     check=False)  # fmt: skip
        return self.kubectl("create", "token", self.neighbour, "-n", self.namespace).strip()

    def seats(self, reader: Reader) -> int:
        """The seats the API server gave the tiny level (0 until it took the level in): its
        share of the server's concurrency, rounded up, so often more than one."""
        want = f'priority_level="{self.prefix}-{LEVEL}"'
        for line in reader.text("/metrics").splitlines():
            if line.startswith("apiserver_flowcontrol_nominal_limit_seats{") and want in line:
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def level(self, reader: Reader) -> dict[str, float]:
        """The tiny level's gauges now (requests and seats executing, waiting), by metric."""
        want = f'priority_level="{self.prefix}-{LEVEL}"'
        out: dict[str, float] = {}
        for line in reader.text("/metrics").splitlines():
            if line.startswith("apiserver_flowcontrol_current_") and want in line:
                name = line.split("{", 1)[0].removeprefix("apiserver_flowcontrol_current_")
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def executing_seats(self, reader: Reader, schema: str) -> int:
        """Seats the API server counts as executing now for one of our flow schemas."""
        want = f'flow_schema="{schema}"'
        for line in reader.text("/metrics").splitlines():
            if line.startswith("apiserver_flowcontrol_current_executing_seats{") and want in line:
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def requests(self, reader: Reader) -> dict[str, dict[str, int]]:
        """Requests of our flow schemas the API server dispatched and rejected (429) so far:
        {schema: {"dispatched": n, "rejected": m}}."""
        out: dict[str, dict[str, int]] = {}
        for line in reader.text("/metrics").splitlines():
            for what in ("dispatched", "rejected"):
                if line.startswith(f"apiserver_flowcontrol_{what}_requests_total{{"):
                    schema = line.split('flow_schema="', 1)[1].split('"', 1)[0]
                    if schema.startswith(self.prefix):
                        counts = out.setdefault(schema, {"dispatched": 0, "rejected": 0})
                        counts[what] += int(float(line.rsplit(" ", 1)[1]))
        return out


class SeatHolder:
    """Another client on the operator's priority level that takes every seat it has, for as
    long as the test says. Each of its `seats` connections asks for a large document (`path`)
    and reads only the status line: the API server's handler then blocks writing the rest into
    a full socket and keeps its seat until the connection closes. While all are held, every
    request on the level is rejected (429), deterministically; a busy neighbour only made
    rejections likely (measured: 0 to 6 of 17 operator requests rejected from run to run)."""

    RCVBUF = 4096  # bytes the kernel buffers for each held connection: far less than `path`

    def __init__(self, reader: Reader, token: str, path: str, seats: int) -> None:
        split = urllib.parse.urlsplit(reader.server)
        self.host, self.port = split.hostname or "127.0.0.1", split.port or 443
        self.ctx, self.token, self.path, self.seats = reader.ctx, token, path, seats
        self.held: list[ssl.SSLSocket] = []
        self.answers: dict[int, int] = {}  # HTTP status -> count, holding or probing
        self.retry_after: set[str] = set()  # what the 429s asked

    def __enter__(self) -> SeatHolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def hold(self, mine: Callable[[], int], timeout: float = 30.0) -> None:
        """Take every seat: open connections until `mine()` (the seats the API server counts
        as executing for this holder) reaches `seats`. A request that finds the seats taken
        is rejected (by another client's request, for its few milliseconds): try again. Then
        check that one more request of the level is rejected."""
        deadline = time.monotonic() + timeout
        while mine() < self.seats:
            assert time.monotonic() < deadline, (
                f"holding {mine()} of {self.seats} seats with {len(self.held)} connections; "
                f"answers {self.answers}"
            )
            conn = self._open()
            if len(self.held) < self.seats and self._status(conn) == 200:
                self.held.append(conn)
            else:
                conn.close()
                time.sleep(0.05)
        assert self.probe() == 429, f"a request got through {self.seats} held seats"

    def probe(self) -> int:
        """One more request of the level: its status (read whole, so it holds nothing)."""
        conn = self._open()
        try:
            return self._status(conn)
        finally:
            conn.close()

    def release(self) -> None:
        for conn in self.held:
            conn.close()
        self.held.clear()

    def _open(self) -> ssl.SSLSocket:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)  # before connect
        raw.settimeout(10)
        raw.connect((self.host, self.port))
        conn = self.ctx.wrap_socket(raw, server_hostname=self.host)
        conn.sendall(
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: Bearer {self.token}\r\nAccept: application/json\r\n\r\n".encode()
        )
        return conn

    def _status(self, conn: ssl.SSLSocket) -> int:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 16384:
            chunk = conn.recv(1024)
            if not chunk:
                break
            head += chunk
        line, _, rest = head.partition(b"\r\n")
        code = int(line.split()[1]) if line.startswith(b"HTTP/") else 0
        self.answers[code] = self.answers.get(code, 0) + 1
        for header in rest.decode(errors="replace").split("\r\n"):
            if header.lower().startswith("retry-after:"):
                self.retry_after.add(header.split(":", 1)[1].strip())
        return code


__all__ = ["Kubectl", "Reader", "SeatHolder", "ThrottledIdentity", "etcd_compact", "wait"]
