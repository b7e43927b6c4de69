"""The KV notification codec (pdworker.contract) that prefill writes and decode reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdworker.contract import (
    FAILURE_REASONS,
    KVChunk,
    KVFail,
    KVMeta,
    decode_notification,
    encode_notification,
)

rooms = st.integers(0, 2**63 - 1)
checksums = st.text(alphabet="0123456789abcdef", min_size=1, max_size=64)
notes = st.one_of(
    st.builds(KVChunk, rooms, st.integers(0, 2**20)),
    st.builds(KVMeta, rooms, st.integers(1, 2**20), st.integers(0, 2**31), checksums),
    st.builds(KVFail, rooms, st.sampled_from(FAILURE_REASONS)),
)


@given(notes)
def test_round_trip(note: KVChunk | KVMeta | KVFail) -> None:
    assert decode_notification(encode_notification(note)) == note


@given(st.binary(max_size=300))
def test_decoding_any_bytes_never_raises(raw: bytes) -> None:
    note = decode_notification(raw)
    if note is not None:  # whatever decodes, re-encodes to a message that decodes the same
        assert decode_notification(encode_notification(note)) == note


@pytest.mark.parametrize(
    "raw",
    [b"kv:\xc2\xb2:0", "kv:²:0".encode(), b"kv:-1:0", b"kv: 1:0", b"kv:1:0:0", b"meta:1:0:3:ab",
     b"meta:1:1:2:a:b", b"kv:" + b"9" * 25 + b":0", b"fail:1", b"kv:1:" + b"1" * 300, b""],
)  # fmt: skip
def test_malformed_notifications_are_ignored(raw: bytes) -> None:
    assert decode_notification(raw) is None


def test_unknown_failure_reason_reads_as_transfer_error() -> None:
    assert decode_notification(b"fail:5:gremlins") == KVFail(5, "transfer_error")
    with pytest.raises(ValueError):
        encode_notification(KVFail(5, "gremlins"))
