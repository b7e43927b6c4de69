"""Which operator replica owns an object when the fleet is split across replicas (`--shard I/N`).

Why: one replica saturates at some fleet size (bench/README.md, issue 27), and kopf's peering
only pauses all but the highest-priority replica; it never splits work. With `--shard I/N` a
replica handles only the PDDeployments and PDRemediationPolicies whose namespace/name hashes to
I modulo N, so N replicas (each with its own peering name for HA) cover the fleet once. The hash
is SHA-256, not Python's `hash()`: every replica, every process and every version must agree.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

MAX_SHARDS = 256
_SPEC = re.compile(r"^(\d{1,3})/(\d{1,3})$")


class ShardError(ValueError):
    """A --shard value that is not INDEX/COUNT with 0 <= INDEX < COUNT <= MAX_SHARDS."""


def shard_of(namespace: str, name: str, count: int) -> int:
    """The shard an object belongs to among `count`: stable across processes and versions."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = _SPEC.match(text.strip())
        if match is None:
            raise ShardError(f"--shard {text!r}: expected INDEX/COUNT, e.g. 0/2")
        index, count = int(match[1]), int(match[2])
        if not 0 < count <= MAX_SHARDS or not 0 <= index < count:
            raise ShardError(
                f"--shard {text!r}: need 0 <= INDEX < COUNT and 1 <= COUNT <= {MAX_SHARDS}"
            )
        return cls(index, count)

    def owns(self, namespace: str, name: str) -> bool:
        return self.count == 1 or shard_of(namespace, name, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def owned_by(shard: Shard | None) -> Any:
    """A kopf `when=` filter: the objects this replica handles (all of them without a shard)."""

    def when(namespace: str | None = None, name: str | None = None, **_: Any) -> bool:
        return shard is None or shard.owns(namespace or "", name or "")

    return when
