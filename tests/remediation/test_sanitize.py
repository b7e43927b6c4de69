"""sanitize: whatever a worker says, what reaches detection and status is bounded and valid."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from pdwarden.api import LedgerEntry
from pdwarden.remediation.scrape import sanitize
from pdwarden.values import RoomView


@given(st.text(), st.integers(min_value=0, max_value=2000))
def test_text_is_printable_and_bounded(value: str, limit: int) -> None:
    out = sanitize.text(value, limit)
    assert len(out) <= limit and out.isprintable()


@given(st.one_of(st.none(), st.text(max_size=400)))
def test_a_pod_name_is_valid_or_none(value: str | None) -> None:
    out = sanitize.pod_name(value)
    assert out is None or out == value
    if out is not None:  # then the ledger accepts it
        LedgerEntry(time=datetime.now(UTC), action="FailRooms", pod=out, peer=out)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_seconds_are_finite_non_negative_and_bounded(value: float) -> None:
    out = sanitize.seconds(value)
    assert 0.0 <= out <= sanitize.MAX_SECONDS


@given(st.builds(RoomView, st.integers(0, 2**63), st.text(), st.floats(allow_nan=False),
                 st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text())))  # fmt: skip
def test_a_room_peer_is_kept_only_if_it_can_be_a_pod(room: RoomView) -> None:
    clean = sanitize.room(room)
    assert clean.room == room.room
    assert clean.peer_pod in (None, room.peer_pod)
    assert clean.peer_pod is not None or clean.peer_incarnation is None
    assert len(clean.phase) <= sanitize.MAX_TOKEN and clean.phase_seconds >= 0


def test_examples() -> None:
    assert sanitize.pod_name("pd-decode-1") == "pd-decode-1"
    assert sanitize.pod_name("x" * 254) is None
    assert sanitize.pod_name("Evil Pod") is None
    assert sanitize.text("a\x00b\nc", 10) == "a b c"
    assert sanitize.text("abcdef", 5) == "ab..."
    assert sanitize.seconds(-5.0) == 0.0
