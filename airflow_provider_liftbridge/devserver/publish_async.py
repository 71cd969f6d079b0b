"""What one PublishAsync call owes its client: the responses waiting to be written and the count
of acks still due (the dev server's gRPC API, ``service.py``, drives it)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .wire import async_error_bytes, build_ack, publish_response_bytes

log = logging.getLogger(__name__)


class AsyncSession:
    """Responses of one PublishAsync call waiting to be written, and the count of acks still owed."""

    __slots__ = ("inbox", "inflight", "out", "wakeup")

    def __init__(self, inbox: str) -> None:
        self.inbox = inbox
        self.out: list[bytes] = []
        self.inflight = 0
        self.wakeup = asyncio.Event()

    def committed(self, arg: tuple[Any, ...], commit_ts: int) -> None:
        part, offset, cid, policy, recv_ts = arg
        ack = build_ack(
            part.stream.name, part.stream.subject, part.subject, offset, self.inbox, cid, policy, recv_ts, commit_ts
        )
        self.out.append(publish_response_bytes(ack.SerializeToString(), cid))
        self.inflight -= 1
        self.wakeup.set()

    def refused(self, arg: tuple[str, int, str], _commit_ts: int) -> None:
        cid, code, message = arg
        self.out.append(async_error_bytes(cid, code, message))
        self.inflight -= 1
        self.wakeup.set()

    def reader_done(self, reader: asyncio.Task[None]) -> None:
        """Done callback of the call's request reader: wake the call, and read the reader's failure
        (the client gone, the server stopping) so asyncio does not report it as never retrieved."""
        self.wakeup.set()
        if not reader.cancelled() and reader.exception() is not None:
            log.debug("PublishAsync request reader ended: %r", reader.exception())
