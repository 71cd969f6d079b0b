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
NATS headers (HPUB) are not part of a Liftbridge message and are not stored.

How it stays cheap (see docs/devserver-ingest.md for the figures): nats-py parses the
protocol and owns the connection (reconnects, re-subscribing, PING/PONG), but two of its
per-message costs are skipped. Messages of the partition subscriptions are handed from
nats-py's parser straight to a per-partition route, without the ``Msg`` object, queue and
callback task nats-py builds for each message; and the acks of one partition write are
queued on the connection as one burst of PUB commands built by nats-py's own command builder.
Both go through the project's one nats-py adapter (:mod:`airflow_provider_liftbridge.nats_adapter`,
shared with the client's bulk path), which checks nats-py's internals once and falls back to
its public API (subscription callbacks, ``publish``) when they do not match: slower, same behaviour.

The route only collects; what a partition received in one event-loop turn is decoded and
stored as one batch (:meth:`NatsIngest._store_batch`, ``Partition.append_many``) and written
together (see :mod:`.state`); acks are built from per-partition and per-inbox byte templates
once the write is done, and go out together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import MAGIC, EnvelopeError, MsgType, decode, encode, encode_ack
from airflow_provider_liftbridge.nats_adapter import FastNats, Route, connect, flush, internals_usable
from airflow_provider_liftbridge.nats_security import NatsSecurity

from .model import REFUSED, NewMessage, is_valid_subject
from .partition import Partition
from .wire import ack_body, ack_commit_field, ack_inbox_field, ack_prefix, ack_times

log = logging.getLogger(__name__)

_NONE = api_pb2.NONE
_ALL = api_pb2.ALL
_PUBLISH = MsgType.PUBLISH
_parse_message = api_pb2.Message.FromString
#: What a payload that is not a valid ``Message`` raises (the codec's ``unmarshal_message`` catches the same).
_BAD_PAYLOAD = (EnvelopeError, DecodeError, RuntimeError, ValueError)
_ACK_INCORRECT_OFFSET = api_pb2.Ack.INCORRECT_OFFSET
#: The 8-byte envelope header of every ack (type Ack, no CRC), taken from the codec once.
_ACK_HEADER = encode(b"", MsgType.ACK, crc=False)
# Messages waiting for nats-py's subscription callback (the fallback path, and with the fast path
# only those arriving before the route is in place): generous limits, since dropping a message as
# a "slow consumer" would lose an unacked publish.
_SUB_PENDING_MSGS = 4_000_000
_SUB_PENDING_BYTES = 1 << 30
_INBOX_CACHE_MAX = 10_000


async def _log_error(exc: Exception) -> None:
    # nats-py reports every failed reconnect attempt here; the disconnect itself is logged once.
    log.debug("NATS connection error: %s", exc)


class NatsIngest:
    """Owns the server's NATS connection: partition subscriptions, ack publishing, PublishToSubject.

    :param url: the NATS server to use.
    :param fast: take the fast path when the installed nats-py allows it (see the module
        docstring); ``False`` uses nats-py's public API only.
    """

    def __init__(self, url: str, *, fast: bool = True, security: NatsSecurity | None = None) -> None:
        self.url = url
        #: Called when the NATS connection is lost (cluster mode: the followers' idle wait).
        self.on_disconnect: Callable[[], None] | None = None
        #: TLS and credentials of the connection to NATS.
        self.security = security
        #: Whether messages bypass nats-py's per-message machinery (see the module docstring).
        self.fast = fast and internals_usable()
        self.nc: NatsClient | None = None
        self._nats: FastNats | None = None  # the adapter over ``nc``
        self._subs: dict[Partition, Subscription] = {}
        #: Acks waiting for their partition's next write, per message:
        #: (subject, offset, inbox, correlation id, policy, reception time, error).
        self._pending: dict[Partition, list[tuple[str, int, str, str, int, int, int]]] = {}
        #: Acks ready to go out: (inbox, enveloped ack).
        self._out: list[tuple[str, bytes]] = []
        self._out_wakeup: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._ack_waiters: dict[str, list[asyncio.Future[api_pb2.Ack]]] = {}
        #: Encoded ``Ack.ackInbox`` field of every inbox seen that is a valid subject.
        self._inbox_fields: dict[str, bytes] = {}
        #: Inboxes already reported as invalid (reported once, not per message).
        self._bad_inboxes: set[str] = set()
        #: Encoded ``Ack`` fields 1-3 per partition and subject the message came on.
        self._ack_prefixes: dict[Partition, dict[str, bytes]] = {}

    async def connect(self) -> None:
        """Connect to NATS and start the ack sender. Later, the connection reconnects by itself,
        renewing the subscriptions, for as long as the server runs.

        :raises OSError, nats.errors.NoServersError: NATS is not reachable.
        """
        nc = await connect(
            self.url,
            name="liftbridge-devserver",
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,  # type: ignore[arg-type]  # typed int, used as seconds to sleep
            connect_timeout=5,
            pending_size=64 * 1024 * 1024,
            skip_subject_validation=True,
            error_cb=_log_error,
            disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected,
            **(self.security.connect_options([self.url]) if self.security is not None else {}),
        )
        self.nc = nc
        self._nats = FastNats(nc, internals=self.fast)
        self.fast = self._nats.internals
        self._out_wakeup = asyncio.Event()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())

    async def _disconnected(self) -> None:
        if self.nc is not None and not self.nc.is_closed and self.on_disconnect is not None:
            self.on_disconnect()
        if self.nc is not None and not self.nc.is_closed:
            log.warning(
                "lost the connection to NATS at %s; reconnecting (NATS publishes are not taken meanwhile)", self.url
            )

    async def _reconnected(self) -> None:
        log.warning("reconnected to NATS at %s; %d partition subscriptions renewed", self.url, len(self._subs))

    async def close(self) -> None:
        """Send the acks still queued, then close the connection."""
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None
        nc, self.nc = self.nc, None
        fast, self._nats = self._nats, None
        if nc is not None and fast is not None:
            try:
                await self._send_out(fast)
                await flush(nc, timeout=2)
            except Exception:  # closing anyway; NATS may already be gone
                log.debug("error while flushing the NATS connection", exc_info=True)
            await nc.close()
        self._subs.clear()
        self._pending.clear()
        self._ack_prefixes.clear()

    # -- subscriptions ----------------------------------------------------------
    async def partition_opened(self, partition: Partition) -> None:
        """Subscribe ``partition`` to its subject (in the stream's queue group), confirmed by the server."""
        nc, fast = self.nc, self._nats
        if partition in self._subs or nc is None or fast is None:
            return
        sub = await fast.route(
            partition.subject,
            self._route(partition),
            queue=partition.stream.group,
            pending_msgs=_SUB_PENDING_MSGS,
            pending_bytes=_SUB_PENDING_BYTES,
        )
        self._subs[partition] = sub
        # A publish racing right behind CreateStream must find the subscription in place (not
        # nc.flush(): nats-py's can return before the SUB reached the server).
        await flush(nc)

    async def partition_closed(self, partition: Partition) -> None:
        """Stop taking NATS messages for ``partition``."""
        sub = self._subs.pop(partition, None)
        if sub is not None:
            if self._nats is not None:
                self._nats.forget(sub)
            try:
                await sub.unsubscribe()
            except Exception:  # connection already closing
                log.debug("unsubscribe failed", exc_info=True)
        self._ack_prefixes.pop(partition, None)
        if partition.deleted:
            self._pending.pop(partition, None)  # its commit callbacks are dropped with it

    # -- the hot path -----------------------------------------------------------
    def commit_failed(self, partition: Partition) -> None:
        """Writing ``partition`` failed: its pending acks are dropped (publishers time out and re-send)."""
        self._pending.pop(partition, None)

    def _route(self, part: Partition) -> Route:
        """The handler of ``part``'s messages: it only collects them (subject and reply as bytes), and
        what arrived in one event-loop turn (one socket read, usually) is stored by :meth:`_ingest`
        in the next, as one batch."""
        inbound: list[tuple[bytes, bytes, bytes]] = []
        call_soon = asyncio.get_running_loop().call_soon
        ingest = self._ingest

        def route(subject: bytes, reply: bytes, data: bytes) -> None:
            if not inbound:
                call_soon(ingest, part, inbound)
            inbound.append((subject, reply, data))

        return route

    def _ingest(self, part: Partition, inbound: list[tuple[bytes, bytes, bytes]]) -> None:
        """Store a batch of ``part``'s NATS messages and arrange their acks (see the module docstring)."""
        batch = inbound.copy()
        inbound.clear()
        repl = part.replication
        link = None if repl is None else repl.leader_link
        if link is not None:
            # The leader is cut off (isolation.py): what its NATS link lets in arrives, maybe late.
            batch = [m for m, ok in zip(batch, link.passes("in", len(batch)), strict=True) if ok]
            if link.delay and batch:
                asyncio.get_running_loop().call_later(link.delay, self._arrived, part, batch)
                return
        self._arrived(part, batch)

    def _arrived(self, part: Partition, batch: list[tuple[bytes, bytes, bytes]]) -> None:
        if part.paused or part.readonly or part.deleted or not batch:
            return
        repl = part.replication
        if repl is not None and not repl.leader_serving:
            # Cluster mode: a stalled leader finds these in its NATS buffer when it runs again; with
            # a dead leader (or none yet after a restart) nobody was subscribed and they are lost.
            # A leader cut off with its receiving side open (cut-out) still takes them.
            if repl.leader_stalled:
                repl.parked.append(lambda: self._arrived(part, batch))
                return
            if repl.leader_link is None or not repl.leader_live:
                return
        if repl is not None and repl.no_leaders:
            return
        try:
            self._store_batch(part, batch)
        except Exception:  # the next batches must still be taken
            log.exception("could not store %d NATS messages for %s/%d", len(batch), part.stream.name, part.id)

    def _store_batch(self, part: Partition, batch: list[tuple[bytes, bytes, bytes]]) -> None:
        now = time.time_ns()
        own_subject_b, own_subject = part.subject.encode(), part.subject
        messages: list[NewMessage] = []
        #: (index in ``messages``, subject, inbox, correlation id, policy) of messages that want an ack.
        wants_ack: list[tuple[int, str, str, str, int]] = []
        for subject_b, reply_b, data in batch:
            subject = own_subject if subject_b == own_subject_b else subject_b.decode()
            reply = reply_b.decode() if reply_b else ""
            msg = None
            if data[:4] == MAGIC:
                try:
                    # decode() checks the header and the CRC-32C; any failure, or another message
                    # type, means the bytes are stored whole, as the real server does. (The type is
                    # compared here: decode's own check of an expected type costs more.)
                    envelope = decode(data)
                    if envelope.msg_type is _PUBLISH:
                        msg = _parse_message(envelope.payload)  # type: ignore[arg-type]  # upb parses any buffer
                except _BAD_PAYLOAD:
                    msg = None
            if msg is None:
                # Expected offset 0: on a non-empty stream with OCC, a plain message is dropped.
                messages.append((b"", data, None, subject, reply, 0))
                continue
            inbox = msg.ackInbox
            if inbox:
                policy = msg.ackPolicy
                if policy != _NONE:
                    wants_ack.append((len(messages), subject, inbox, msg.correlationId, policy))
            messages.append((msg.key, msg.value, msg.headers, subject, reply, msg.offset))
        offsets = part.append_many(messages, now)
        if wants_ack:
            pending = self._pending.get(part)
            if pending is None:
                pending = self._pending[part] = []
                part.after_commit(self._acks_committed, part)
            repl = part.replication
            all_acks: list[tuple[str, int, str, str, int, int, int]] = []
            for i, subject, inbox, cid, ack_policy in wants_ack:
                offset = offsets[i]
                error = 0 if offset != REFUSED else _ACK_INCORRECT_OFFSET
                if repl is not None and ack_policy == _ALL and not error:
                    all_acks.append((subject, offset, inbox, cid, ack_policy, now, error))  # once the ISR has it
                else:
                    pending.append((subject, offset, inbox, cid, ack_policy, now, error))
            if all_acks:
                repl.after_hw(all_acks[-1][1], self._all_acks_committed, (part, all_acks))  # type: ignore[union-attr]

    def _all_acks_committed(
        self, arg: tuple[Partition, list[tuple[str, int, str, str, int, int, int]]], ts: int
    ) -> None:
        """Cluster mode: the high watermark reached the last of these ALL-policy messages."""
        part, pending = arg
        if not part.deleted:
            self._queue_acks(part, pending, ts)

    def _acks_committed(self, part: Partition, commit_ts: int) -> None:
        """Build the acks of everything ``part`` just wrote and queue them for publishing together."""
        pending = self._pending.pop(part, None)
        if pending:
            self._queue_acks(part, pending, commit_ts)

    def _queue_acks(
        self, part: Partition, pending: list[tuple[str, int, str, str, int, int, int]], commit_ts: int
    ) -> None:
        """Build the acks of ``pending`` messages of ``part`` and queue them for publishing together
        (in cluster mode, over the leader's NATS link: isolation.py)."""
        repl = part.replication
        link = None if repl is None else repl.leader_link
        if link is not None:
            pending = [a for a, ok in zip(pending, link.passes("out", len(pending)), strict=True) if ok]
            if link.delay and pending:
                asyncio.get_running_loop().call_later(link.delay, self._send_acks, part, pending, commit_ts)
                return
        self._send_acks(part, pending, commit_ts)

    def _send_acks(
        self, part: Partition, pending: list[tuple[str, int, str, str, int, int, int]], commit_ts: int
    ) -> None:
        # The Ack protobuf is written by hand (wire.ack_body; tests/devserver/test_nats_acks.py holds
        # it equal to ``Ack.SerializeToString()``). Fields 1-3 come from a per-subject template and
        # field 5 from a per-inbox one; fields 8-9 are shared by the messages of one read.
        prefixes = self._ack_prefixes.get(part)
        if prefixes is None:
            prefixes = self._ack_prefixes[part] = {}
        commit_field = ack_commit_field(commit_ts)
        received_at, times = -1, b""
        inbox_fields, out, waiters, body = self._inbox_fields, self._out, self._ack_waiters, ack_body
        for subject, offset, inbox, cid, policy, received, error in pending:
            prefix = prefixes.get(subject) or self._ack_prefix(part, subject)
            inbox_field = inbox_fields.get(inbox) or self._inbox_field(inbox)
            if received != received_at:
                received_at, times = received, ack_times(received, commit_field)
            ack = body(prefix, offset, inbox_field, cid, policy, times, error)
            if inbox in inbox_fields:
                out.append((inbox, _ACK_HEADER + ack))
            if waiters and inbox in waiters:
                self._resolve_waiters(inbox, api_pb2.Ack.FromString(ack))
        if out and self._out_wakeup is not None:
            self._out_wakeup.set()

    def _ack_prefix(self, part: Partition, subject: str) -> bytes:
        """Fields 1-3 of the acks of ``part`` for messages that came on ``subject`` (remembered)."""
        prefix = ack_prefix(part.stream.name, part.stream.subject, subject)
        prefixes = self._ack_prefixes.setdefault(part, {})
        if len(prefixes) > _INBOX_CACHE_MAX:  # a wildcard subject with ever new tokens
            prefixes.clear()
        prefixes[subject] = prefix
        return prefix

    def _inbox_field(self, inbox: str) -> bytes:
        """``Ack.ackInbox`` encoded; remembered (which marks the inbox publishable) when it is a valid subject."""
        field = ack_inbox_field(inbox)
        if not is_valid_subject(inbox):
            # Publishing to it would break the NATS connection for every other ack.
            if inbox not in self._bad_inboxes:
                if len(self._bad_inboxes) > _INBOX_CACHE_MAX:
                    self._bad_inboxes.clear()
                self._bad_inboxes.add(inbox)
                log.warning("not publishing acks to the invalid subject %r", inbox)
            return field
        if len(self._inbox_fields) > _INBOX_CACHE_MAX:  # publishers with one inbox per message
            self._inbox_fields.clear()
        self._inbox_fields[inbox] = field
        return field

    def _publishable(self, inbox: str) -> bool:
        """Whether acks can be published on ``inbox`` (a valid NATS subject)."""
        if inbox not in self._inbox_fields:
            self._inbox_field(inbox)
        return inbox in self._inbox_fields

    async def _send_loop(self) -> None:
        assert self._out_wakeup is not None
        while True:
            await self._out_wakeup.wait()
            self._out_wakeup.clear()
            fast = self._nats
            if fast is None:
                return
            try:
                await self._send_out(fast)
            except Exception:  # keep sending later acks
                log.warning("could not publish acks", exc_info=True)

    async def _send_out(self, fast: FastNats) -> None:
        out, self._out = self._out, []
        if not out or fast.nc.is_closed:
            return
        inboxes, payloads = zip(*out, strict=True)
        await fast.publish_burst(inboxes, payloads)

    # -- acks of the gRPC API and PublishToSubject ------------------------------
    def send_ack(self, inbox: str, ack: api_pb2.Ack) -> None:
        """Queue ``ack`` for publishing on ``inbox`` and hand it to in-process waiters of that inbox."""
        if self._publishable(inbox):
            self._out.append((inbox, encode_ack(ack)))
            if self._out_wakeup is not None:
                self._out_wakeup.set()
        self._resolve_waiters(inbox, ack)

    def _resolve_waiters(self, inbox: str, ack: api_pb2.Ack) -> None:
        waiters = self._ack_waiters.pop(inbox, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(ack)

    def wait_for_ack(self, inbox: str) -> asyncio.Future[api_pb2.Ack]:
        """A future resolved with the first ack this server sends to ``inbox``."""
        fut: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        self._ack_waiters.setdefault(inbox, []).append(fut)
        return fut

    def forget_ack_waiter(self, inbox: str, fut: asyncio.Future[api_pb2.Ack]) -> None:
        """Drop a waiter from :meth:`wait_for_ack` that is no longer wanted (its call timed out)."""
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
