"""The asyncio client: executes the shared operations with grpc.aio on shared channels, and reads
subscriptions either on grpc.aio too or, by default, on a blocking gRPC stream in a worker thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TypeVar

from . import operations, subscription
from .base import ClientBase
from .compression import Compression
from .consumer import AutoOffset
from .group_consumer import AsyncGroupConsumer
from .partitioners import PartitionerFunc
from .publishing import batch, single
from .publishing.options import PublishOptions, PublishPath
from .publishing.resend import ResendPolicy
from .requests import StartAt, StopAt
from .transport.aio import AsyncTransport
from .transport.channels import ChannelFactory
from .transport.nats import NatsLink
from .types import Ack, AckPolicy, Message, Metadata, PartitionInfo, Record, StartPosition

__all__ = ["AsyncLiftbridgeClient"]

_R = TypeVar("_R")


class AsyncLiftbridgeClient(ClientBase):
    """The asyncio Liftbridge client: the constructor and methods of
    :class:`~.sync_client.LiftbridgeClient`, with every method a coroutine and ``subscribe``
    an async iterator (``async for msg in client.subscribe(...)``).

    Channels are shared process-wide per event loop, broker and TLS settings, so many clients
    (e.g. triggers in one triggerer) open one connection per broker. ``close()`` releases them.

    Subscriptions are read, by default, by one worker thread each on a blocking gRPC stream,
    which hands messages to the event loop in bursts (``subscription_reader="thread"``): several
    times cheaper per message than grpc.aio. For many concurrent, mostly idle subscriptions (a
    thousand triggers in one triggerer) pass ``subscription_reader="aio"``: no thread at all.
    Either way, closing the subscription (``aclose()``, leaving ``async for``) or cancelling the
    consuming task ends its thread and call at once, and ``close()`` ends every subscription of
    the client with :class:`~.errors.ClientClosedError`.
    """

    def _open(self, factory: ChannelFactory, subscription_channels: int) -> None:
        self._transport = AsyncTransport(
            factory,
            subscription_channels,
            NatsLink(self.nats_servers, self._core.timeout, self.nats_security),
            self.subscription_reader,
        )

    async def create_stream(
        self,
        subject: str,
        name: str,
        *,
        partitions: int = 1,
        replication_factor: int = 1,
        group: str | None = None,
        retention_max_bytes: int | None = None,
        retention_max_messages: int | None = None,
        retention_max_age: timedelta | None = None,
        cleaner_interval: timedelta | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age: timedelta | None = None,
        compact_enabled: bool | None = None,
        compact_max_goroutines: int | None = None,
        auto_pause_time: timedelta | None = None,
        auto_pause_disable_if_subscribers: bool | None = None,
        min_isr: int | None = None,
        optimistic_concurrency_control: bool | None = None,
        encryption: bool | None = None,
    ) -> None:
        """Like :meth:`LiftbridgeClient.create_stream`, awaited; same arguments, result and errors."""
        return await self._transport.run(
            operations.create_stream(
                self._core,
                subject,
                name,
                partitions=partitions,
                replication_factor=replication_factor,
                group=group,
                retention_max_bytes=retention_max_bytes,
                retention_max_messages=retention_max_messages,
                retention_max_age=retention_max_age,
                cleaner_interval=cleaner_interval,
                segment_max_bytes=segment_max_bytes,
                segment_max_age=segment_max_age,
                compact_enabled=compact_enabled,
                compact_max_goroutines=compact_max_goroutines,
                auto_pause_time=auto_pause_time,
                auto_pause_disable_if_subscribers=auto_pause_disable_if_subscribers,
                min_isr=min_isr,
                optimistic_concurrency_control=optimistic_concurrency_control,
                encryption=encryption,
            )
        )

    async def delete_stream(self, name: str) -> None:
        """Like :meth:`LiftbridgeClient.delete_stream`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.delete_stream(self._core, name))

    async def pause_stream(self, name: str, partitions: Sequence[int] | None = None, resume_all: bool = False) -> None:
        """Like :meth:`LiftbridgeClient.pause_stream`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.pause_stream(self._core, name, partitions, resume_all))

    async def set_stream_readonly(
        self, name: str, partitions: Sequence[int] | None = None, readonly: bool = True
    ) -> None:
        """Like :meth:`LiftbridgeClient.set_stream_readonly`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.set_stream_readonly(self._core, name, partitions, readonly))

    async def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
        partitioner: PartitionerFunc | None = None,
        ack_policy: AckPolicy | None = None,
        expected_offset: int | None = None,
        ack_inbox: str | None = None,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        """Like :meth:`LiftbridgeClient.publish`, awaited; same arguments, result and errors."""
        return await self._transport.run(
            single.publish(
                self._core,
                stream,
                value,
                key=key,
                headers=headers,
                partition=partition,
                partitioner=partitioner,
                ack_policy=ack_policy,
                expected_offset=expected_offset,
                ack_inbox=ack_inbox,
                correlation_id=correlation_id,
                timeout=timeout,
            )
        )

    async def publish_many(
        self,
        stream: str,
        records: Iterable[Record | bytes],
        *,
        partition: int | None = None,
        partitioner: PartitionerFunc | None = None,
        ack_policy: AckPolicy | None = None,
        window: int | None = None,
        timeout: float | None = None,
        path: PublishPath = "auto",
        resend: ResendPolicy | None = None,
        compression: Compression = None,
    ) -> list[Ack]:
        """Like :meth:`LiftbridgeClient.publish_many`, awaited; same arguments, result and errors."""
        return await self._transport.run(
            batch.publish_many(
                self._core,
                stream,
                records,
                PublishOptions(path, partition, partitioner, ack_policy, window, timeout, resend, compression),
            )
        )

    def group_consumer(
        self,
        group_id: str,
        streams: str | Sequence[str],
        *,
        consumer_id: str | None = None,
        auto_offset: AutoOffset = "new_only",
        auto_commit_interval: float | None = 5.0,
        max_batch: int = 512,
        idle_wait: float = 0.2,
        handover: bool = True,
    ) -> AsyncGroupConsumer:
        """Like :meth:`LiftbridgeClient.group_consumer`: same arguments and errors; the member's
        ``join``, ``commit`` and ``leave`` are coroutines, ``messages`` an async iterator."""
        return AsyncGroupConsumer(
            self._transport.run,
            self._transport.drive,
            self._core,
            group_id,
            streams,
            consumer_id=consumer_id,
            auto_offset=auto_offset,
            auto_commit_interval=auto_commit_interval,
            max_batch=max_batch,
            idle_wait=idle_wait,
            handover=handover,
        )

    async def publish_to_subject(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_policy: AckPolicy | None = None,
        ack_inbox: str | None = None,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        """Like :meth:`LiftbridgeClient.publish_to_subject`, awaited; same arguments, result and errors."""
        return await self._transport.run(
            single.publish_to_subject(
                self._core,
                subject,
                value,
                key=key,
                headers=headers,
                ack_policy=ack_policy,
                ack_inbox=ack_inbox,
                correlation_id=correlation_id,
                timeout=timeout,
            )
        )

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_at: StartAt = StartPosition.EARLIEST,
        stop_at: StopAt = None,
        read_isr_replica: bool = False,
        resume: bool = False,
    ) -> AsyncIterator[Message]:
        """Like :meth:`LiftbridgeClient.subscribe`, as an async iterator; same arguments, result and errors."""
        return self._transport.drive(
            subscription.subscribe(
                self._core,
                stream,
                partition=partition,
                start_at=start_at,
                stop_at=stop_at,
                read_isr_replica=read_isr_replica,
                resume=resume,
            )
        )

    async def fetch_metadata(self, streams: Sequence[str] | None = None) -> Metadata:
        """Like :meth:`LiftbridgeClient.fetch_metadata`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.fetch_metadata(self._core, streams))

    async def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        """Like :meth:`LiftbridgeClient.fetch_partition_metadata`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.fetch_partition_metadata(self._core, stream, partition))

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Like :meth:`LiftbridgeClient.set_cursor`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.set_cursor(self._core, cursor_id, stream, partition, offset))

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int:
        """Like :meth:`LiftbridgeClient.fetch_cursor`, awaited; same arguments, result and errors."""
        return await self._transport.run(operations.fetch_cursor(self._core, cursor_id, stream, partition))

    async def close(self) -> None:
        """Release this client's shared channels and close its NATS connection; idempotent."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
