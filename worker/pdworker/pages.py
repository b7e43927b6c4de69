"""Page accounting for a paged KV pool: which room owns which pages, and nothing leaks.

Pure and thread-safe; the tensor itself lives in model.KVPool. Freeing is by owner and
idempotent, so every exit path of a room can call `free(room)` without double-free worries.
Pages come out in ascending runs where the free list allows (freed pages go back so that the
next allocation takes them in the same order): NIXL merges a run of consecutive pages on both
sides into one descriptor, so ordered pages mean fewer, larger copies (one per chunk on a quiet
pool) instead of one per page.
"""

from __future__ import annotations

import threading


class PagePool:
    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError("a KV pool needs at least one page")
        self.total = total
        self._lock = threading.Lock()
        self._free = list(range(total - 1, -1, -1))
        self._owned: dict[int, list[int]] = {}

    def alloc(self, owner: int, count: int) -> list[int] | None:
        """Give `owner` `count` pages, or None if not enough are free (nothing is taken)."""
        with self._lock:
            if owner in self._owned:
                raise ValueError(f"owner {owner} already holds pages")
            if count > len(self._free):
                return None
            pages = [self._free.pop() for _ in range(count)]
            self._owned[owner] = pages
            return pages

    def free(self, owner: int) -> int:
        with self._lock:
            pages = self._owned.pop(owner, [])
            self._free.extend(reversed(pages))  # a stack: popped again in ascending order
            return len(pages)

    def pages_of(self, owner: int) -> list[int]:
        with self._lock:
            return list(self._owned.get(owner, []))

    @property
    def free_count(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def owners(self) -> int:
        with self._lock:
            return len(self._owned)
