"""Rotated Secrets while a real prefill/decode pair serves (worker processes, NIXL over UCX).

Each pod's Secret volume is refreshed on its own schedule, so the two sides of a pair see a new
bootstrap key at different moments, in either order, and the operator's admin token changes
before the worker's file does. Rotated here one file at a time, as the kubelet does (an atomic
swap): every request completes, the new values are taken without a restart, and the replaced
ones are refused once the worker's grace (`--secret-grace`) has passed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench.harness import BOOTSTRAP_TOKEN, TOKEN, Proc, Workers, wait_for
from e2e.httpjson import http

pytestmark = pytest.mark.nixl
GRACE = 15.0  # seconds: a few requests on a busy machine fit in it; short for a test
KEY_1, KEY_2 = "rotated-bootstrap-key-1-" + "k" * 24, "rotated-bootstrap-key-2-" + "k" * 24
NEW_TOKEN = "rotated-admin-token-" + "t" * 24


def rotate(path: Path, value: str) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)  # as the kubelet swaps a Secret volume's data in


def key_files(tmp: Path, name: str) -> tuple[Path, Path]:
    boot, admin = tmp / f"{name}-bootstrap", tmp / f"{name}-admin"
    boot.write_text(BOOTSTRAP_TOKEN + "\n")
    admin.write_text(TOKEN + "\n")
    return boot, admin


def worker(pd: Workers, role: str, name: str) -> tuple[Proc, Path, Path]:
    """A worker whose key files are its own, so one side can be rotated before the other."""
    boot, admin = key_files(pd.tmp, name)
    proc = pd.worker(role, "--bootstrap-token-file", str(boot), "--admin-token-file", str(admin),
                     "--secret-grace", str(GRACE), name=name)  # fmt: skip
    return proc, boot, admin


def serves(router: Proc, n: int = 4) -> None:
    for i in range(n):
        body = {"input_ids": list(range(1, 40 + i)), "max_new_tokens": 3}
        status, answer = http("POST", f"{router.url}/generate", body, timeout=30)
        assert status == 200 and answer.get("ok") is True, answer


def admin_status(proc: Proc, token: str) -> int:
    status, _ = http("GET", f"{proc.url}/admin/rooms", token=token, timeout=10)
    return status


def heartbeat_status(prefill: Proc, key: str) -> int:
    """A bootstrap POST under `key` (401: the key is refused; anything else got past it)."""
    url = f"http://127.0.0.1:{prefill.bootstrap_port}/bootstrap/heartbeat"
    status, _ = http("POST", url, {"agent": "nobody"}, token=key, timeout=10)
    return status


def rotations(proc: Proc) -> int:
    return proc.log.read_text().count("bootstrap token file")


def test_keys_rotated_side_by_side_fail_no_request_and_the_old_ones_expire(pd: Workers) -> None:
    prefill, p_boot, p_admin = worker(pd, "prefill", "prefill-r")
    decode, d_boot, _ = worker(pd, "decode", "decode-r")
    router = pd.router([prefill], [decode])
    serves(router)

    # First rotation, the prefill first: the decode (old key only) still registers its rooms,
    # and a decode that links to it afresh still recognises it (a proof under each key).
    late, _, _ = worker(pd, "decode", "decode-late")  # old key, first link after the rotation
    late_router = pd.router([prefill], [late])
    rotate(p_boot, KEY_1)
    wait_for(lambda: heartbeat_status(prefill, KEY_1) != 401, 10, "the prefill to read its key")
    serves(late_router)
    serves(router)
    rotate(d_boot, KEY_1)
    wait_for(lambda: rotations(decode) == 1, 10, "the decode to read its first key")
    serves(router)

    # Second rotation, the decode first: refused under the new key by a prefill that has not
    # read it yet, it registers its rooms under the key that one still holds.
    rotate(d_boot, KEY_2)
    wait_for(lambda: rotations(decode) == 2, 10, "the decode to read its second key")
    assert heartbeat_status(prefill, KEY_2) == 401  # the prefill does not know it yet
    serves(router, 8)
    rotate(p_boot, KEY_2)
    wait_for(lambda: heartbeat_status(prefill, KEY_2) != 401, 10, "the prefill's second key")
    serves(router)

    # The admin token: the operator's new one works once the file is read, the old one for the
    # grace only; the bootstrap key two rotations back is refused at once, the last one after
    # the grace.
    rotate(p_admin, NEW_TOKEN)
    wait_for(lambda: admin_status(prefill, NEW_TOKEN) == 200, 10, "the new admin token")
    assert admin_status(prefill, TOKEN) == 200  # inside the grace
    assert heartbeat_status(prefill, BOOTSTRAP_TOKEN) == 401
    wait_for(lambda: admin_status(prefill, TOKEN) == 403, GRACE + 10, "the old token refused")
    wait_for(lambda: heartbeat_status(prefill, KEY_1) == 401, GRACE + 10, "the old key refused")
    assert admin_status(prefill, NEW_TOKEN) == 200
    serves(router)  # the pair, both on the newest key, serves on
    assert "accepted for 15 s more" in prefill.log.read_text()
