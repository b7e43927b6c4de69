"""The token key rotated while a PDDeployment serves (SECURITY.md, "Rotating the token key").

On the local cluster, with the operator, its workers and a client sending requests all along:
the operator's key file is replaced (it reads it again, no restart), the deployment's Secrets are
deleted (the operator recreates them from the new key), and the kubelet refreshes the workers'
Secret volumes (they read them again, no restart). Asserted: no request fails; the operator
never loses sight of the prefill's rooms (its scrapes keep working, with the old key's token
while the worker still holds it); the new token works once the worker read it; the old one is
refused after the worker's grace.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster, OperatorProcess
from e2e.httpjson import http
from e2e.pdtools import apply, cpu_example, get_json, pods, router_url, wait_ready

from pdwarden.constants import WORKER_PORT
from pdwarden.render import names
from pdwarden.tokens import derive_token

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
OLD_KEY, NEW_KEY = b"old-key-" + b"o" * 32, b"new-key-" + b"n" * 32
GRACE = 20  # the workers' --secret-grace: seconds the replaced token stays accepted


class Client:
    """Requests through the router, one after another, until stopped; every answer kept."""

    def __init__(self, url: str) -> None:
        self.url, self.answers = url, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            body = {"text": f"rotation {i}", "max_new_tokens": 4}
            code, answer = http("POST", self.url + "/generate", body, timeout=30)
            self.answers.append((code, answer))

    def finish(self) -> list[Any]:
        self.stop.set()
        self.thread.join(60)
        return [a for a in self.answers if a[0] != 200 or a[1].get("ok") is not True]


def rotate(path: Path, key: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(key)
    os.replace(tmp, path)


def test_the_token_key_is_rotated_while_serving_without_a_restart_or_a_failed_request(
    cluster: Cluster, namespace: str, crd: str, tmp_path: Path
) -> None:
    ns, key_file = namespace, tmp_path / "token-key"
    key_file.write_bytes(OLD_KEY)
    log = tmp_path / "operator.log"
    operator = OperatorProcess(cluster, [ns], log, f"--token-key-file={key_file}").start()
    try:
        grace = {"args": ["--secret-grace", str(GRACE)]}
        apply(cluster, ns, cpu_example(prefill=grace, decode=grace))
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "2/2", "router": "1/1"})
        uid = get_json(cluster, ns, "pdd", "pd")["metadata"]["uid"]
        old, new = (derive_token(k, ns, "pd", uid) for k in (OLD_KEY, NEW_KEY))
        prefill = pods(cluster, ns, "prefill")[0]
        rooms_url = f"http://{prefill['status']['podIP']}:{WORKER_PORT}/admin/rooms"

        def takes(token: str) -> bool:
            return http("GET", rooms_url, token=token, timeout=10)[0] == 200

        assert takes(old) and not takes(new)
        operator.wait_cycles(2)
        errors = operator.metric("pdwarden_scrape_errors_total")
        client = Client(router_url(cluster, ns))

        rotate(key_file, NEW_KEY)
        cluster.wait_until("the operator to read its new key", lambda: "token key rotated"
                           in log.read_text(), 30)  # fmt: skip
        n = names("pd")
        cluster.kubectl("delete", "secret", "-n", ns, n.admin_secret, n.bootstrap_secret)
        deleted = time.monotonic()
        cluster.wait_until("the new token to be taken", lambda: takes(new), 120)
        taken = time.monotonic()
        assert takes(old)  # within the grace
        operator.wait_cycles(3)  # cycles that scraped with the new token, or the old one
        assert operator.metric("pdwarden_scrape_errors_total") == errors
        cluster.wait_until("the old token refused", lambda: not takes(old), GRACE + 30)
        refused = time.monotonic()
        operator.wait_cycles(2)
        failed = client.finish()
        assert len(client.answers) > 10 and not failed, failed[:3]
        assert operator.metric("pdwarden_scrape_errors_total") == errors
        print(f"[rotation] new token taken {taken - deleted:.1f} s after the Secrets were "
              f"deleted, old one refused {refused - taken:.1f} s after that (grace {GRACE} s); "
              f"{len(client.answers)} requests through the rotation, none failed; the operator's "
              f"scrape errors unchanged")  # fmt: skip
    finally:
        operator.stop()
