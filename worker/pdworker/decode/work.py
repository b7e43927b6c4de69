"""What decode keeps per room while it waits for, checks and decodes the room's KV.

Why a module of its own: the request path (`worker`) and the notification inbox (`inbox`) both
read and write these records, from the event loop only; neither owns the other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass, field

import torch


@dataclass
class DecodeWork:
    ids: list[int]
    max_new: int
    link: str
    done: asyncio.Future[None]
    agent: str = ""
    pages: list[int] = field(default_factory=list)
    chunks: set[int] = field(default_factory=set)
    n_chunks: int | None = None
    first_token: int = 0
    checksum: str = ""
    registered: bool = False  # prefill may hold our pages as a destination
    prefill_knows: bool = False  # the failure came from prefill: no ABORT needed
    finished: bool = False
    transfer_started: float = 0.0
    untrusted: bool = False  # the bootstrap endpoint did not prove it is one of ours (403)
    # The compute call reading the room's pages (`_verify_and_read`): it outlives a cancelled
    # request, so cleanup waits for it before the pages can be freed and rewritten.
    reading: concurrent.futures.Future[tuple[bool, torch.Tensor]] | None = None
