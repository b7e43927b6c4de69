"""Token files read again when rotated (`pdworker.secret_file`): plain unit tests, fake clock."""

from __future__ import annotations

import os
from pathlib import Path

from pdworker.secret_file import CHECK_EVERY_S, MAX_SECRET_BYTES, Secret


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rotate(path: Path, value: str) -> None:
    """As the kubelet does: a new file swapped in atomically (a new inode)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)


def test_a_rotated_file_is_used_at_once_and_the_old_value_only_for_the_grace(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("old\n")
    secret = Secret(str(path), grace_s=30, clock=clock)
    assert secret.current() == "old" and secret.accepted() == ("old",)
    rotate(path, "new")
    clock.now += CHECK_EVERY_S
    assert secret.current() == "new"
    assert secret.accepted() == ("new", "old")
    assert secret.matching(b"old") == "old" and secret.matching(b"new") == "new"
    clock.now += 29.9
    assert secret.matching(b"old") == "old"
    clock.now += 0.2
    assert secret.accepted() == ("new",)
    assert secret.matching(b"old") is None and secret.matching(b"new") == "new"


def test_the_file_is_looked_at_most_once_per_check_interval(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("old")
    secret = Secret(str(path), clock=clock)
    rotate(path, "new")
    assert secret.current() == "old"  # not looked at again yet
    clock.now += CHECK_EVERY_S
    assert secret.current() == "new"


def test_empty_unreadable_or_huge_files_never_replace_the_value_held(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("held")
    secret = Secret(str(path), clock=clock)
    for bad in ("", "\n", "x" * (MAX_SECRET_BYTES + 1)):
        rotate(path, bad)
        clock.now += CHECK_EVERY_S
        assert secret.accepted() == ("held",), repr(bad[:8])
    path.write_bytes(b"\xff\xfe")
    clock.now += CHECK_EVERY_S
    assert secret.accepted() == ("held",)
    path.unlink()
    clock.now += CHECK_EVERY_S
    assert secret.accepted() == ("held",)
    rotate(path, "back")  # the file comes back: read again
    clock.now += CHECK_EVERY_S
    assert secret.current() == "back"


def test_a_file_missing_at_start_is_picked_up_when_it_appears(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    secret = Secret(str(path), clock=clock)
    assert secret.current() is None and secret.accepted() == ()
    assert secret.matching(b"") is None and secret.matching(None) is None
    path.write_text("first")
    clock.now += CHECK_EVERY_S
    assert secret.accepted() == ("first",)  # nothing replaced: no grace for anything


def test_fixed_values_and_none() -> None:
    assert Secret.of("tok").accepted() == ("tok",)
    assert Secret.of(None).accepted() == () and Secret.of("").current() is None
    held = Secret.of("x")
    assert Secret.of(held) is held
