"""The NATS side: every running partition subscribes to its subject; messages are stored, acks published.

What arrives on a partition's subject is handled as the real server handles it:

- an enveloped ``Message`` (magic, header, protobuf; with or without CRC-32C): key,
  value and headers come from it, and once it is written an ack goes to its
  ``ackInbox`` (unless the ack policy is NONE), as an envelope of type Ack without CRC;
- anything else (plain payloads, and envelopes with a bad CRC, another message type
  or an undecodable body) is stored whole as the value of a plain message, no ack.

Paused, read-only and deleted partitions drop what arrives, as do streams with
optimistic concurrency control when the offset check fails (an enveloped
publisher with an ack inbox gets an ack with ``ackError = INCORRECT_OFFSET``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import MAGIC, EnvelopeError, encode_ack, unmarshal_message

from .state import IncorrectOffsetError, Partition
from .wire import ACK_INCORRECT_OFFSET, build_ack

log = logging.getLogger(__name__)

_NONE = api_pb2.NONE
# Generous limits: dropping a message as a "slow consumer" would lose an unacked publish.
_SUB_PENDING_MSGS = 4_000_000
_SUB_PENDING_BYTES = 1 << 30
_YIELD_EVERY = 256


class NatsIngest:
    """Owns the server's NATS connection: partition subscriptions, ack publishing, PublishToSubject.

    :param url: the NATS server to use.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.nc: NatsClient | None = None
        self._subs: dict[Partition, Subscription] = {}
        self._acks: list[tuple[str, bytes]] = []
        self._ack_wakeup = asyncio.Event()
        self._ack_task: asyncio.Task[None] | None = None
        self._ack_waiters: dict[str, list[asyncio.Future[api_pb2.Ack]]] = {}
        self._handled = 0

    async def connect(self) -> None:
        """Connect to NATS and start the ack sender.

        :raises OSError, nats.errors.NoServersError: NATS is not reachable.
        """
        self.nc = await nats.connect(
            self.url,
            name="liftbridge-devserver",
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=5,
            pending_size=64 * 1024 * 1024,
            skip_subject_validation=True,
        )
        self._ack_task = asyncio.get_running_loop().create_task(self._send_acks())

    async def close(self) -> None:
        """Send the acks still queued, then close the connection."""
        if self._ack_task is not None:
            self._ack_task.cancel()
            self._ack_task = None
        if self.nc is not None:
            nc, self.nc = self.nc, None
            try:
                for inbox, payload in self._acks:
                    await nc.publish(inbox, payload)
                self._acks.clear()
                await nc.drain()
            except Exception:  # closing anyway; NATS may already be gone
                log.debug("error while closing the NATS connection", exc_info=True)
                await nc.close()
        self._subs.clear()

    # -- subscriptions ----------------------------------------------------------
    async def partition_opened(self, partition: Partition) -> None:
        """Subscribe ``partition`` to its subject (in the stream's queue group), confirmed by the server."""
        if partition in self._subs or self.nc is None:
            return

        async def on_msg(msg: Msg) -> None:
            self.handle(partition, msg.subject, msg.reply, msg.data)
            self._handled += 1
            if self._handled >= _YIELD_EVERY:
                # nats-py hands queued messages over without yielding; let the flush (and so the
                # acks) and gRPC calls run between batches instead of after the whole backlog.
                self._handled = 0
                await asyncio.sleep(0)

        sub = await self.nc.subscribe(
            partition.subject,
            queue=partition.stream.group,
            cb=on_msg,
            pending_msgs_limit=_SUB_PENDING_MSGS,
            pending_bytes_limit=_SUB_PENDING_BYTES,
        )
        self._subs[partition] = sub
        # A publish racing right behind CreateStream must find the subscription in place.
        await self.nc.flush()

    async def partition_closed(self, partition: Partition) -> None:
        """Stop taking NATS messages for ``partition``."""
        sub = self._subs.pop(partition, None)
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:  # connection already closing
                log.debug("unsubscribe failed", exc_info=True)

    # -- the hot path -----------------------------------------------------------
    def handle(self, part: Partition, subject: str, reply: str, data: bytes) -> None:
        """Store one NATS message on ``part`` and arrange its ack (see the module docstring)."""
        if part.paused or part.readonly or part.deleted:
            return
        now = time.time_ns()
        msg = None
        if data[:4] == MAGIC:
            try:
                msg = unmarshal_message(data)
            except EnvelopeError:
                msg = None
        if msg is None:
            try:
                part.append(b"", data, None, subject, reply, 0, now)
            except IncorrectOffsetError:
                pass  # a plain message on a non-empty OCC stream is dropped
            return
        inbox = msg.ackInbox
        policy = msg.ackPolicy
        cid = msg.correlationId
        try:
            offset = part.append(msg.key, msg.value, msg.headers, subject, reply, msg.offset, now)
        except IncorrectOffsetError:
            if inbox and policy != _NONE:
                part.after_commit(
                    self._ack_committed, (part, subject, -1, inbox, cid, policy, now, ACK_INCORRECT_OFFSET)
                )
            return
        if inbox and policy != _NONE:
            part.after_commit(self._ack_committed, (part, subject, offset, inbox, cid, policy, now, 0))

    def _ack_committed(self, arg: tuple[Any, ...], commit_ts: int) -> None:
        part, subject, offset, inbox, cid, policy, recv_ts, error = arg
        ack = build_ack(part, subject, offset, inbox, cid, policy, recv_ts, commit_ts, error)
        self.send_ack(inbox, ack)

    def send_ack(self, inbox: str, ack: api_pb2.Ack) -> None:
        """Queue ``ack`` for publishing on ``inbox`` and hand it to in-process waiters of that inbox."""
        self._acks.append((inbox, encode_ack(ack)))
        self._ack_wakeup.set()
        waiters = self._ack_waiters.pop(inbox, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(ack)

    async def _send_acks(self) -> None:
        while True:
            await self._ack_wakeup.wait()
            self._ack_wakeup.clear()
            acks, self._acks = self._acks, []
            nc = self.nc
            if nc is None:
                return
            for inbox, payload in acks:
                try:
                    await nc.publish(inbox, payload)
                except Exception:  # a bad inbox name must not stop the other acks
                    log.warning("could not publish an ack to %r", inbox, exc_info=True)

    # -- PublishToSubject -------------------------------------------------------
    def wait_for_ack(self, inbox: str) -> asyncio.Future[api_pb2.Ack]:
        """A future resolved with the first ack this server sends to ``inbox``."""
        fut: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        self._ack_waiters.setdefault(inbox, []).append(fut)
        return fut

    def forget_ack_waiter(self, inbox: str, fut: asyncio.Future[api_pb2.Ack]) -> None:
        waiters = self._ack_waiters.get(inbox)
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._ack_waiters[inbox]

    async def publish(self, subject: str, payload: bytes) -> None:
        """Publish raw bytes on NATS (PublishToSubject).

        :raises ConnectionError: the NATS connection is closed.
        """
        if self.nc is None:
            raise ConnectionError("the dev server's NATS connection is closed")
        await self.nc.publish(subject, payload)
