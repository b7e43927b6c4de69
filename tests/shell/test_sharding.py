"""`pdwarden run --shard I/N`: every object is handled by exactly one of N replicas, the same one
in every process, and every object handler of both kinds is filtered by it."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from pdwarden.main import RunConfig, build_registry
from pdwarden.run import add_arguments
from pdwarden.sharding import Shard, ShardError, owned_by, shard_of

NAMES = [(f"team-{i % 7}", f"pd-{i:04d}") for i in range(2000)]


def test_each_object_has_exactly_one_owner_among_the_shards() -> None:
    shards = [Shard(i, 4) for i in range(4)]
    for namespace, name in NAMES:
        assert sum(s.owns(namespace, name) for s in shards) == 1


def test_the_split_is_even_enough() -> None:
    counts = Counter(shard_of(ns, name, 4) for ns, name in NAMES)
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) < 1.2 * len(NAMES) / 4  # SHA-256 spreads; 2000 names, ~500 each


def test_the_owner_does_not_depend_on_the_process() -> None:
    # Known answers (SHA-256 of "namespace/name"): a replica of another version, or another
    # process with another PYTHONHASHSEED, must place an object where this one does. A change
    # here moves objects between running replicas during an upgrade.
    assert [shard_of("default", "pd", n) for n in (2, 3, 5, 7, 1000)] == [0, 2, 0, 4, 780]
    assert shard_of("team-a", "llama-70b", 1000) == 162


@pytest.mark.parametrize("text", ["", "1", "2/2", "-1/2", "0/0", "a/b", "0/257", " 1/2/3"])
def test_bad_shards_are_refused(text: str) -> None:
    with pytest.raises(ShardError, match="--shard"):
        Shard.parse(text)


def test_one_shard_owns_everything() -> None:
    assert all(Shard.parse("0/1").owns(ns, name) for ns, name in NAMES[:50])
    assert owned_by(None)(namespace="any", name="thing")


def test_every_object_handler_is_filtered_by_the_shard() -> None:
    shard = Shard(1, 3)
    registry = build_registry(RunConfig(shard=shard))
    handlers = [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    kinds = {str(h.selector.any_name) for h in handlers}
    assert kinds == {"pddeployments", "pdremediationpolicies"}
    mine = next((ns, n) for ns, n in NAMES if shard.owns(ns, n))
    other = next((ns, n) for ns, n in NAMES if not shard.owns(ns, n))
    for h in handlers:
        assert h.when is not None, h.id
        assert h.when(namespace=mine[0], name=mine[1]) is True, h.id
        assert h.when(namespace=other[0], name=other[1]) is False, h.id


def test_the_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).shard is None
    assert Shard.parse(parser.parse_args(["--shard", "2/4"]).shard) == Shard(2, 4)
