"""Admin tokens are derived from the deployment's identity, so the operator never reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdwarden.tokens import (
    CHECK_EVERY_S,
    ROTATION_WINDOW_S,
    TokenKey,
    TokenKeyError,
    derive_bootstrap_token,
    derive_token,
    load_key,
)

KEY = b"0123456789abcdef0123456789abcdef"


def test_token_is_stable_and_specific_to_one_incarnation() -> None:
    a = derive_token(KEY, "ns", "pd", "uid-1")
    assert a == derive_token(KEY, "ns", "pd", "uid-1")
    assert len(a) >= 40
    others = {
        derive_token(KEY, "ns", "pd", "uid-2"),
        derive_token(KEY, "ns2", "pd", "uid-1"),
        derive_token(KEY, "ns", "pd2", "uid-1"),
        derive_token(b"another key of 32 bytes........", "ns", "pd", "uid-1"),
    }
    assert a not in others
    assert len(others) == 4


def test_bootstrap_key_is_per_deployment_and_never_the_admin_token() -> None:
    key = derive_bootstrap_token(KEY, "ns", "pd", "uid-1")
    assert key == derive_bootstrap_token(KEY, "ns", "pd", "uid-1")
    assert key != derive_token(KEY, "ns", "pd", "uid-1")
    assert key != derive_bootstrap_token(KEY, "ns", "pd", "uid-2")
    assert key != derive_bootstrap_token(KEY, "ns", "pd2", "uid-1")
    # Names that spell the label into an admin-token message still give another value.
    assert key != derive_token(KEY, "pdwarden.dev", "bootstrap-v1\nns", "pd/uid-1")


def test_key_file_must_exist_and_be_long_enough(tmp_path: Path) -> None:
    with pytest.raises(TokenKeyError, match="cannot read"):
        load_key(tmp_path / "missing")
    short = tmp_path / "short"
    for text in (b"abc\n", KEY[:31] + b"\n"):  # 31 bytes of key: one short
        short.write_bytes(text)
        with pytest.raises(TokenKeyError, match="at least 32 bytes"):
            load_key(short)
    good = tmp_path / "good"
    good.write_bytes(KEY + b"\n")
    assert load_key(good) == KEY


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def rotate(path: Path, key: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(key)
    os.replace(tmp, path)  # as the kubelet swaps a Secret volume's data in


def test_a_rotated_key_file_is_read_again_and_the_key_it_replaced_is_kept(tmp_path: Path) -> None:
    path, clock = tmp_path / "key", Clock()
    path.write_bytes(KEY + b"\n")
    key = TokenKey(path, clock=clock)
    assert key.current() == KEY and key.previous() is None
    new = b"N" * 40
    rotate(path, new)
    assert key.current() == KEY  # looked at again only after CHECK_EVERY_S
    assert not key.rotated_lately()
    clock.now += CHECK_EVERY_S
    assert key.current() == new and key.previous() == KEY
    assert key.rotated_lately()
    clock.now += ROTATION_WINDOW_S
    assert not key.rotated_lately()
    clock.now += 3600  # kept until the next rotation: Secrets still hold tokens of the old key
    assert key.previous() == KEY
    rotate(path, b"short")  # refused like at start: the key held stays, with its previous
    clock.now += CHECK_EVERY_S
    assert (key.current(), key.previous()) == (new, KEY)
    path.unlink()
    clock.now += CHECK_EVERY_S
    assert key.current() == new


def test_a_fixed_key_and_a_short_one() -> None:
    fixed = TokenKey.of(KEY)
    assert fixed is not None and fixed.current() == KEY and fixed.previous() is None
    assert TokenKey.of(None) is None and TokenKey.of(fixed) is fixed
    with pytest.raises(TokenKeyError):
        TokenKey(key=b"short")
