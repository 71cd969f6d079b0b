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

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import MAGIC, EnvelopeError, MsgType, encode, unmarshal_message

from .natsconn import NatsConnection, NatsConnectionError
from .state import IncorrectOffsetError, Partition, is_valid_subject
from .wire import ACK_INCORRECT_OFFSET, ack_bytes

log = logging.getLogger(__name__)

_NONE = api_pb2.NONE


class NatsIngest:
    """Owns the server's NATS connection: partition subscriptions, ack publishing, PublishToSubject.

    Messages are handled synchronously as the connection reads them (see :mod:`.natsconn`);
    everything stored in one event-loop turn is written with one write per partition, and the
    acks for it go out in one socket write after that.

    :param url: the NATS server to use.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: NatsConnection | None = None
        self._subs: dict[Partition, int] = {}
        #: Acks waiting for their partition's next write: (subject, offset, inbox, correlation id,
        #: policy, reception time, error) per message, sent together once it is written.
        self._pending: dict[Partition, list[tuple[str, int, str, str, int, int, int]]] = {}
        self._ack_waiters: dict[str, list[asyncio.Future[bytes]]] = {}
        self._good_inboxes: set[str] = set()

    async def connect(self) -> None:
        """Connect to NATS (it reconnects by itself, re-subscribing, if the connection drops later).

        :raises NatsConnectionError: NATS is not reachable.
        """
        conn = NatsConnection(self.url)
        await conn.connect()
        self.conn = conn

    async def close(self) -> None:
        """Send the acks still queued, then close the connection."""
        conn, self.conn = self.conn, None
        if conn is not None:
            await conn.close()
        self._subs.clear()
        self._pending.clear()

    # -- subscriptions ----------------------------------------------------------
    async def partition_opened(self, partition: Partition) -> None:
        """Subscribe ``partition`` to its subject (in the stream's queue group), confirmed by the server."""
        conn = self.conn
        if partition in self._subs or conn is None:
            return
        handle = self.handle

        def on_msg(subject: str, reply: str, data: bytes, received_ns: int) -> None:
            handle(partition, subject, reply, data, received_ns)

        self._subs[partition] = conn.subscribe(partition.subject, on_msg, partition.stream.group)
        # A publish racing right behind CreateStream must find the subscription in place.
        try:
            await conn.flush()
        except (NatsConnectionError, TimeoutError):
            log.warning("NATS did not confirm the subscription to %r; it is renewed on reconnect", partition.subject)

    async def partition_closed(self, partition: Partition) -> None:
        """Stop taking NATS messages for ``partition``."""
        sid = self._subs.pop(partition, None)
        if sid is not None and self.conn is not None:
            self.conn.unsubscribe(sid)
        if partition.deleted:
            self._pending.pop(partition, None)  # its commit callbacks are dropped with it

    # -- the hot path -----------------------------------------------------------
    def handle(self, part: Partition, subject: str, reply: str, data: bytes, now: int) -> None:
        """Store one NATS message received at ``now`` (ns) on ``part`` and arrange its ack (module docstring)."""
        if part.paused or part.readonly or part.deleted:
            return
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
        try:
            offset = part.append(msg.key, msg.value, msg.headers, subject, reply, msg.offset, now)
            error = 0
        except IncorrectOffsetError:
            offset, error = -1, ACK_INCORRECT_OFFSET
        if inbox and policy != _NONE:
            pending = self._pending.get(part)
            if pending is None:
                pending = self._pending[part] = []
                part.after_commit(self._acks_committed, part)
            pending.append((subject, offset, inbox, msg.correlationId, policy, now, error))

    def commit_failed(self, partition: Partition) -> None:
        """Writing ``partition`` failed: its pending acks are dropped (publishers time out and re-send)."""
        self._pending.pop(partition, None)

    def _acks_committed(self, part: Partition, commit_ts: int) -> None:
        """Publish the acks of everything ``part`` just wrote, in one go."""
        pending = self._pending.pop(part, None)
        conn = self.conn
        if not pending or conn is None:
            return
        out: list[tuple[str, bytes]] = []
        good, prefix_of, waiters = self._good_inboxes, part.ack_prefix, self._ack_waiters
        for subject, offset, inbox, cid, policy, recv_ts, error in pending:
            ack = ack_bytes(prefix_of(subject), offset, inbox, cid, policy, recv_ts, commit_ts, error)
            if inbox in good or self._check_inbox(inbox):
                out.append((inbox, encode(ack, MsgType.ACK, crc=False)))
            if waiters:
                self._resolve_waiters(inbox, ack)
        conn.publish_many(out)

    def send_ack(self, inbox: str, ack: bytes) -> None:
        """Publish the serialized ``Ack`` ``ack`` on ``inbox`` and hand it to in-process waiters of that inbox.

        Acks queued in one loop turn go out in one socket write.
        """
        conn = self.conn
        if conn is not None and (inbox in self._good_inboxes or self._check_inbox(inbox)):
            conn.publish(inbox, encode(ack, MsgType.ACK, crc=False))
        self._resolve_waiters(inbox, ack)

    def _resolve_waiters(self, inbox: str, ack: bytes) -> None:
        waiters = self._ack_waiters.pop(inbox, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(ack)

    def _check_inbox(self, inbox: str) -> bool:
        if not is_valid_subject(inbox):
            # A bad inbox name must not corrupt the connection for the other acks.
            log.warning("not publishing an ack to the invalid subject %r", inbox)
            return False
        if len(self._good_inboxes) > 10_000:  # publishers with one inbox per message
            self._good_inboxes.clear()
        self._good_inboxes.add(inbox)
        return True

    # -- PublishToSubject -------------------------------------------------------
    def wait_for_ack(self, inbox: str) -> asyncio.Future[bytes]:
        """A future resolved with the first ack (serialized ``Ack``) this server sends to ``inbox``."""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._ack_waiters.setdefault(inbox, []).append(fut)
        return fut

    def forget_ack_waiter(self, inbox: str, fut: asyncio.Future[bytes]) -> None:
        waiters = self._ack_waiters.get(inbox)
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._ack_waiters[inbox]

    async def publish(self, subject: str, payload: bytes) -> None:
        """Publish raw bytes on NATS (PublishToSubject); ``subject`` must be a valid subject.

        :raises ConnectionError: the NATS connection is closed.
        """
        if self.conn is None:
            raise ConnectionError("the dev server's NATS connection is closed")
        self.conn.publish(subject, payload)
