"""NATS-direct publishing: enveloped messages straight to a stream's NATS subject, acks read
from an ack inbox.

This is the bulk path (tens of thousands of acknowledged messages per second from Python, where
gRPC manages a few thousand): the broker stores an enveloped message it receives on a stream's
subject exactly as if it came through Publish, and sends the ack to the message's ack inbox. It
needs the NATS servers the brokers listen to. Built on nats-py and the project's codec.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge.codec import EnvelopeError, new_message, unmarshal_ack

from ._core import ack_from_pb, check_ack
from .errors import AckTimeoutError, InvalidArgumentError, LiftbridgeError, PublishError, UnavailableError
from .types import Ack, AckPolicy, Record

__all__ = ["NatsPublisher", "partition_subject", "publish_many_direct"]

log = logging.getLogger(__name__)


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject of a stream partition: ``subject`` for 0, ``subject.N`` for N."""
    if partition < 0:
        raise InvalidArgumentError(f"partition must be >= 0, got {partition}")
    return subject if partition == 0 else f"{subject}.{partition}"


class NatsPublisher:
    """Publishes enveloped messages on NATS and collects their acks. An async context manager.

    :param nc: a connected nats-py client (see :meth:`connect`).
    """

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc

    @classmethod
    async def connect(cls, servers: str | Sequence[str], *, connect_timeout: float = 5.0) -> NatsPublisher:
        """Connect to NATS.

        :raises UnavailableError: no NATS server could be reached.
        """
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls:
            raise InvalidArgumentError("nats_servers is empty; give at least one 'nats://host:port' URL")
        try:
            nc = await nats.connect(
                servers=urls,
                connect_timeout=int(max(1, connect_timeout)),
                max_reconnect_attempts=3,
                allow_reconnect=True,
            )
        except Exception as exc:  # nats-py raises several unrelated types for "cannot connect"
            raise UnavailableError(f"cannot connect to NATS at {urls}: {exc}; check nats_servers") from exc
        return cls(nc)

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

    async def _publish_record(
        self, subject: str, rec: Record, inbox: str, correlation_id: str | None, ack_policy: AckPolicy
    ) -> None:
        await self.publish(
            partition_subject(subject, rec.partition or 0),
            rec.value,
            key=rec.key,
            headers=rec.headers,
            ack_inbox=inbox,
            correlation_id=correlation_id,
            ack_policy=ack_policy,
            expected_offset=rec.expected_offset,
        )

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
        *,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        window: int = 1024,
        timeout: float = 10.0,
    ) -> list[Ack]:
        """Publish records on the partition subjects of the stream subject ``subject`` (a
        record's ``partition`` picks ``subject.N``), at most ``window`` unacknowledged at a time,
        and return their acks in input order (``[]`` with ``AckPolicy.NONE``).

        A message the broker drops without an ack (paused partition, a refused expected offset on
        some servers) shows up as a timeout: ``timeout`` bounds the wait for each ack.

        :raises PublishError: some record was refused or not acknowledged within ``timeout``.
        """
        if window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {window}")
        items = [Record(r) if isinstance(r, bytes | bytearray) else r for r in records]
        if ack_policy == AckPolicy.NONE:
            for rec in items:
                await self._publish_record(subject, rec, "", None, ack_policy)
            await self._nc.flush()
            return []
        batch = uuid.uuid4().hex[:12]
        ids = [rec.correlation_id or f"{batch}-{i}" for i, rec in enumerate(items)]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError("correlation ids must be unique within one publish_many call")
        index_of = {cid: i for i, cid in enumerate(ids)}
        acks: list[Ack | None] = [None] * len(items)
        errors: dict[int, LiftbridgeError] = {}
        room = asyncio.Semaphore(window)
        progress = asyncio.Event()
        inbox = self.new_inbox()

        async def on_ack(msg: Any) -> None:
            ack = _decode_ack(msg.data)
            i = index_of.get(ack.correlation_id, -1) if ack is not None else -1
            if ack is None or i < 0 or acks[i] is not None or i in errors:
                return
            try:
                acks[i] = check_ack(ack)
            except LiftbridgeError as exc:
                errors[i] = exc
            room.release()
            progress.set()

        sub = await self._nc.subscribe(inbox, cb=on_ack)
        sent = 0
        try:
            for i, rec in enumerate(items):
                if errors:
                    break
                await _wait(room.acquire(), timeout, lambda: _first_missing(acks, errors))
                await self._publish_record(subject, rec, inbox, ids[i], ack_policy)
                sent += 1
            while sum(1 for a in acks[:sent] if a is not None) + len(errors) < sent:
                progress.clear()
                await _wait(progress.wait(), timeout, lambda: _first_missing(acks, errors))
        except _AckWaitExpired as exp:
            cause = AckTimeoutError(
                f"no ack for record {exp.index} on subject {subject!r} within {timeout:g} s; the broker may have"
                " dropped it (paused partition, refused expected offset) or be down"
            )
            errors[exp.index] = cause
            raise _error(acks, exp.index, errors, str(cause)) from cause
        finally:
            await sub.unsubscribe()
        if errors:
            first = min(errors)
            raise _error(acks, first, errors, f"record {first} was refused: {errors[first]}") from errors[first]
        return [a for a in acks if a is not None]


class _AckWaitExpired(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


def _first_missing(acks: list[Ack | None], errors: dict[int, LiftbridgeError]) -> int:
    return next((i for i, a in enumerate(acks) if a is None and i not in errors), 0)


async def _wait(aw: Any, timeout: float, missing: Any) -> None:
    try:
        await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise _AckWaitExpired(missing()) from None


def _error(acks: list[Ack | None], index: int | None, errors: dict[int, LiftbridgeError], why: str) -> PublishError:
    done = sum(1 for a in acks if a is not None)
    return PublishError(f"{done} of {len(acks)} records acknowledged; {why}", acks=acks, index=index, errors=errors)


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
    *,
    ack_policy: AckPolicy = AckPolicy.LEADER,
    window: int = 1024,
    timeout: float = 10.0,
) -> list[Ack]:
    """Blocking convenience for code without an event loop (e.g. Spark executors): connect,
    :meth:`NatsPublisher.publish_many`, close.

    :raises PublishError: see :meth:`NatsPublisher.publish_many`.
    :raises UnavailableError: NATS could not be reached.
    """

    async def run() -> list[Ack]:
        async with await NatsPublisher.connect(servers) as pub:
            return await pub.publish_many(subject, records, ack_policy=ack_policy, window=window, timeout=timeout)

    return asyncio.run(run())
