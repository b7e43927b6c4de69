"""The decode role (see `worker`): the request path, prefill links, the inbox, per-room work."""

from pdworker.decode.work import DecodeWork
from pdworker.decode.worker import DecodeWorker

__all__ = ["DecodeWork", "DecodeWorker"]
