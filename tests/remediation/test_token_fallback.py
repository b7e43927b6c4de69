"""After an admin token rotation, workers that have not read their new token are asked with the
old one: which token is remembered, and when the admin call falls back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from pdwarden.constants import WORKER_PORT
from pdwarden.remediation.act.worker_admin import AdminCallError, fail_rooms
from pdwarden.remediation.memory import DeploymentMemory, token_with_fallback
from pdwarden.values import Target

TARGET = Target(
    pod="prefill-0", uid="u", role="prefill", ip="127.0.0.1", port=WORKER_PORT, rooms=True
)


def test_the_token_a_rotation_replaced_is_the_fallback_until_the_next_one() -> None:
    mem = DeploymentMemory()
    assert token_with_fallback(mem, "a") == ("a", None)
    assert token_with_fallback(mem, "a") == ("a", None)
    assert token_with_fallback(mem, "b") == ("b", "a")
    assert token_with_fallback(mem, "b") == ("b", "a")  # kept: workers may still hold "a"
    assert token_with_fallback(mem, None) == (None, "a")  # a Secret unreadable for a moment
    assert token_with_fallback(mem, "b") == ("b", "a")
    assert token_with_fallback(mem, "c") == ("c", "b")
    assert token_with_fallback(mem, "b") == ("b", "c")  # rolled back: the other way round


class Admin:
    """A worker's admin API that takes one token; every call is recorded."""

    def __init__(self, accepts: str, status: int = 403) -> None:
        self.accepts, self.status, self.calls = accepts, status, []  # type: ignore[var-annotated]

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int:
        self.calls.append(token)
        if token != self.accepts:
            raise AdminCallError(f"HTTP {self.status}: wrong admin token", self.status)
        return len(rooms)


def test_fail_rooms_asks_again_with_the_fallback_only_when_the_token_was_refused() -> None:
    old = Admin(accepts="a")
    assert asyncio.run(fail_rooms(old, TARGET, [1, 2], "b", "a")) == 2
    assert old.calls == ["b", "a"]
    new = Admin(accepts="b")
    assert asyncio.run(fail_rooms(new, TARGET, [1], "b", "a")) == 1
    assert new.calls == ["b"]  # the current token first, and nothing more
    for refused in (Admin(accepts="x"), Admin(accepts="a", status=500)):
        with pytest.raises(AdminCallError):
            asyncio.run(fail_rooms(refused, TARGET, [1], "b", "a"))
    assert refused.calls == ["b"]  # a 500 is no token refusal: not asked again
    nothing = Admin(accepts="a")
    with pytest.raises(AdminCallError):
        asyncio.run(fail_rooms(nothing, TARGET, [1], "b", None))
    assert nothing.calls == ["b"]
