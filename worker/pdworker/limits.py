"""Every bound the worker puts on what arrives from the network, in one place.

Why one module: a cap that lives next to the code that enforces it gets changed in one place
and forgotten in another (the body cap was 64 MiB in three apps). Each number here bounds memory
or work that a caller, authenticated or not, can make a worker spend; tests import these names
to probe the edges rather than repeating the numbers.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB

# JSON bodies, per endpoint. /generate carries up to MAX_PROMPT_TOKENS ids of at most 7 digits.
MAX_PROMPT_TOKENS: Final = 1 << 20
MAX_NEW_TOKENS: Final = 4096
GENERATE_BODY_BYTES: Final = 12 * MIB
ADMIN_BODY_BYTES: Final = 2 * MIB  # /admin/rooms/fail: up to MAX_ROOMS_PER_CALL room ids
MAX_ROOMS_PER_CALL: Final = 100_000
BOOTSTRAP_PEER_BODY_BYTES: Final = 512 * KIB  # NIXL metadata (base64) plus a few numbers
BOOTSTRAP_ROOM_BODY_BYTES: Final = 4 * MIB  # a room's destination page list
BOOTSTRAP_SMALL_BODY_BYTES: Final = 4 * KIB  # heartbeat and abort
# Bodies above this are parsed in a thread, so a large one never blocks the event loop.
PARSE_INLINE_BYTES: Final = 64 * KIB

# The bootstrap server.
MAX_METADATA_BYTES: Final = 256 * KIB  # NIXL agent metadata (UCX, one pool: ~0.5 KiB)
MAX_PEER_PAGES: Final = 1 << 18  # pages in one decode pool (descriptors are built per page)
MAX_DECODE_PEERS: Final = 256  # live decode peers one prefill serves
MAX_TOTAL_PEER_PAGES: Final = 1 << 21  # pages of all live peers together (NIXL descriptors)
MAX_PENDING_BINDINGS: Final = 4096  # rooms decode registered before prefill saw the request
MAX_NAME_CHARS: Final = 253  # agent, pod and incarnation names
PEER_REGISTRATIONS_AT_ONCE: Final = 2  # descriptor lists being built at the same time
PEER_REGISTRATIONS_QUEUED: Final = 16  # registrations running or waiting their turn

# Decode's links to prefill bootstrap servers.
MAX_PREFILL_LINKS: Final = 64
PREFILL_PROBES_AT_ONCE: Final = 8
BOOTSTRAP_INFO_BYTES: Final = 64 * KIB  # largest /bootstrap/info answer decode reads

# Prefill: chunks of one room computed-and-queued or on the wire at once (chunk n+1's forward
# runs while chunk n is written; a room never holds more NIXL handles than this).
CHUNKS_IN_FLIGHT_PER_ROOM: Final = 4

# Rooms a worker holds at once (default of --max-rooms); more is 429.
DEFAULT_MAX_ROOMS: Final = 4096

# HTTP servers (listen.py; bodies: server.body_of): what a client, authenticated or not, can
# hold. A request head must arrive within HEAD_TIMEOUT_S of connecting (or of its first byte on
# a kept-alive connection) and a body within BODY_TIMEOUT_S; an idle kept-alive connection
# closes after KEEPALIVE_S (longer than aiohttp clients keep theirs, 15 s, so they close first).
HEAD_TIMEOUT_S: Final = 10.0
BODY_TIMEOUT_S: Final = 30.0
KEEPALIVE_S: Final = 75.0
LINGER_S: Final = 2.0  # reading (and dropping) the rest of a refused body before closing
# Bodies being read and parsed at once, per process: a full budget answers 503 at once. At least
# the largest body cap, so a largest body can always be read when nothing else is.
INFLIGHT_BODY_BYTES: Final = 64 * MIB
# Open connections per port: a room per connection from the router, plus probes, scrapes and
# admin calls. Never more than the open-files limit allows (listen.connection_cap): half of
# what FD_RESERVE leaves goes to accepted connections, split between the process's ports.
MAX_CONNECTIONS_PER_PORT: Final = DEFAULT_MAX_ROOMS + 512
FD_RESERVE: Final = 256  # NIXL/UCX, torch, logs, outgoing connections
OPEN_FILES_TARGET: Final = 1 << 16  # the soft open-files limit is raised to this (or the hard)
