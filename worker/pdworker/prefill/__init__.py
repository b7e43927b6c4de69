"""The prefill role, one module per step of a room's life (see `worker` for the map)."""

from pdworker.prefill.state import Binding, ChunkJob, DecodePeer, RoomWork
from pdworker.prefill.worker import PrefillWorker

__all__ = ["Binding", "ChunkJob", "DecodePeer", "PrefillWorker", "RoomWork"]
