"""Admin tokens are derived from the deployment's identity, so the operator never reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdwarden.tokens import TokenKeyError, derive_bootstrap_token, derive_token, load_key

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
