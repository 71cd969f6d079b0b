"""A standalone NATS publisher for callers that hold only a NATS URL (tests, the ack trigger's
helpers): enveloped messages on a subject, acks read from an inbox."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge.codec import EnvelopeError, new_message, unmarshal_ack
from airflow_provider_liftbridge.nats_security import NatsSecurity

from ..conversion import ack_from_pb
from ..errors import InvalidArgumentError
from ..transport.nats import connect_nats
from ..types import Ack, AckPolicy, Record
from .correlation import correlation_ids
from .nats_engine import outcome_acks, partition_subject, send_over_nats
from .options import PublishOptions
from .resend import NO_RESEND

__all__ = ["NatsPublisher", "publish_many_direct"]

log = logging.getLogger(__name__)


class NatsPublisher:
    """Publishes enveloped messages on NATS and collects their acks. An async context manager.

    :param nc: a connected nats-py client (see :meth:`connect`).
    """

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc

    @classmethod
    async def connect(
        cls, servers: str | Sequence[str], *, connect_timeout: float = 5.0, security: NatsSecurity | None = None
    ) -> NatsPublisher:
        """Connect to NATS (see :func:`~..transport.nats.connect_nats`).

        :raises InvalidArgumentError: no server given, or unusable TLS / NKEY files.
        :raises UnavailableError: no NATS server could be reached, or it refused the credentials.
        """
        return cls(await connect_nats(servers, connect_timeout=connect_timeout, security=security))

    async def close(self) -> None:
        """Flush and close the NATS connection; idempotent."""
        if not self._nc.is_closed:
            await self._nc.drain()

    async def __aenter__(self) -> NatsPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def new_inbox(self) -> str:
        """A fresh, unique ack inbox subject."""
        return str(self._nc.new_inbox())

    async def publish(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_inbox: str | None = None,
        correlation_id: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        expected_offset: int | None = None,
    ) -> None:
        """Publish one enveloped message on ``subject`` (a partition's subject). Its ack, if the
        policy asks for one, goes to ``ack_inbox``: read it with :meth:`acks`."""
        frame = new_message(
            value,
            key=key or b"",
            headers=headers,
            ack_inbox=ack_inbox or "",
            correlation_id=correlation_id or "",
            ack_policy=int(ack_policy),
            expected_offset=-1 if expected_offset is None else expected_offset,
        )
        await self._nc.publish(subject, frame)

    async def acks(self, inbox: str) -> AsyncIterator[Ack]:
        """Yield the acks arriving on ``inbox`` until the caller stops iterating. Frames that are
        not acks are logged and skipped."""
        sub = await self._nc.subscribe(inbox)
        try:
            async for msg in sub.messages:
                ack = _decode_ack(msg.data)
                if ack is not None:
                    yield ack
        finally:
            await sub.unsubscribe()

    async def publish_many(
        self,
        subject: str,
        records: Iterable[Record | bytes],
        options: PublishOptions | None = None,
    ) -> list[Ack]:
        """Publish records on the partition subjects of the stream subject ``subject`` (a
        record's ``partition`` picks ``subject.N``; ``options.partition`` and ``partitioner``
        are not used) with ``options`` (ack policy default ``LEADER``, at most ``window``
        unacknowledged at a time, default :data:`~.options.NATS_WINDOW`), and return their acks in
        input order (``[]`` with ``AckPolicy.NONE``).

        A record without an ack ``options.timeout`` seconds after it was sent (default:
        :attr:`~.options.PublishOptions.wait`) fails the call with an :class:`AckTimeoutError`,
        unless ``options.resend`` allows sending it again (e.g. :data:`~.resend.DEFAULT_RESEND`:
        at-least-once). Unlike ``LiftbridgeClient.publish_many``, which re-sends by default, this
        standalone publisher does not unless asked: holding only a NATS connection, it cannot read
        a partition back to tell a lost record from a late ack (the client does, see
        :mod:`.timeout_recovery`), so a blind re-send could store a record twice. A message the broker
        drops without an ack (paused or read-only partition) ends as an :class:`AckTimeoutError`.

        :raises PublishError: some record was refused or not acknowledged; ``.errors`` holds the
            typed error of each (``IncorrectOffsetError``, ``MessageTooLargeError``,
            ``AckTimeoutError``, ...).
        :raises InvalidArgumentError: a bad record or duplicate correlation id, before
            anything is sent.
        """
        options = options or PublishOptions()
        if options.resend is None:
            options = options.replace(resend=NO_RESEND)
        items: list[Record | bytes] = list(records)
        kinds = set(map(type, items))  # at C speed: the per-record work below is for mixed input
        if not kinds <= {bytes, Record}:
            items = [
                r if type(r) is bytes else Record(bytes(r)) if isinstance(r, bytearray | memoryview) else r
                for r in items
            ]
            for i, rec in enumerate(items):
                if not isinstance(rec, Record | bytes):
                    raise InvalidArgumentError(f"record {i} is a {type(rec).__name__}; pass Record objects or bytes")
        if kinds == {bytes}:
            subjects = [subject] * len(items)
        else:
            subject_of: dict[int, str] = {}
            subjects = []
            for rec in items:
                p = (rec.partition or 0) if isinstance(rec, Record) else 0
                if p not in subject_of:
                    subject_of[p] = partition_subject(subject, p)
                subjects.append(subject_of[p])
        out = await send_over_nats(self._nc, subjects, items, correlation_ids(items), options)
        return outcome_acks(out, f"subject {subject!r} (ack timeout {options.wait:g} s)")


def _decode_ack(data: bytes) -> Ack | None:
    try:
        return ack_from_pb(unmarshal_ack(data))
    except EnvelopeError as exc:
        log.warning("ignoring a frame on an ack inbox that is not an ack: %s", exc)
        return None


def publish_many_direct(
    servers: str | Sequence[str],
    subject: str,
    records: Iterable[Record | bytes],
    options: PublishOptions | None = None,
    *,
    security: NatsSecurity | None = None,
) -> list[Ack]:
    """Blocking convenience for code without an event loop: connect (with ``security``: TLS and
    credentials), :meth:`NatsPublisher.publish_many`, close.

    :raises PublishError: see :meth:`NatsPublisher.publish_many`.
    :raises UnavailableError: NATS could not be reached.
    """

    async def run() -> list[Ack]:
        async with await NatsPublisher.connect(servers, security=security) as pub:
            return await pub.publish_many(subject, records, options)

    return asyncio.run(run())
