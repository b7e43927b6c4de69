"""The KV transport: the interface the roles speak (`interface`) and its NIXL adapter (`nixl`)."""

from pdworker.transfer.interface import (
    WRITE_WAIT_GRACE_S,
    Done,
    TransferError,
    Transport,
    write_blocking,
)
from pdworker.transfer.nixl import (
    DRAIN_ACTIVE_S,
    MAX_BUFFERED_NOTIFS,
    NixlTransport,
    make_agent,
)

__all__ = [
    "DRAIN_ACTIVE_S",
    "MAX_BUFFERED_NOTIFS",
    "WRITE_WAIT_GRACE_S",
    "Done",
    "NixlTransport",
    "TransferError",
    "Transport",
    "make_agent",
    "write_blocking",
]
