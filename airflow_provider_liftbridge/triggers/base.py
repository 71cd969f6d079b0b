"""What the Liftbridge triggers share: the async hook's lifetime, error events, JSON-safe
messages, start positions and the offset waiter.

Every trigger yields exactly one event, ``{"status": "success", ...}`` or
``{"status": "error", "message": ..., "error_type": ...}``, and closes its client before yielding.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_liftbridge.client import (
    AsyncLiftbridgeClient,
    LiftbridgeError,
    Message,
    PartitionInfo,
    PartitionPausedError,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook

__all__ = [
    "LiftbridgeBaseTrigger",
    "closing_subscription",
    "jsonable",
    "message_to_json",
    "paused_high_watermark",
    "wait_for_offset",
]

_T = TypeVar("_T")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def message_to_json(message: Message) -> dict[str, Any]:
    """A delivered message as a JSON-safe dict: bytes (key, value, header values) as base64,
    plus ``value_text`` when the value is valid UTF-8 (``None`` otherwise)."""
    try:
        text: str | None = message.value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "stream": message.stream,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": message.timestamp,
        "subject": message.subject,
        "reply_subject": message.reply_subject,
        "key": None if message.key is None else _b64(message.key),
        "value": _b64(message.value),
        "value_text": text,
        "headers": {name: _b64(value) for name, value in message.headers.items()},
    }


def jsonable(value: Any) -> Any:
    """``value`` if it survives JSON as it is, else its ``repr`` (for apply-function results)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


@contextlib.asynccontextmanager
async def closing_subscription(iterator: AsyncIterator[_T]) -> AsyncIterator[AsyncIterator[_T]]:
    """Close an async subscription (messages or acks) when the reader stops early, so the server
    stream or NATS subscription ends with it."""
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


#: How often a wait on a paused partition looks again (it does not resume the partition).
PAUSED_POLL_SECONDS = 2.0


async def wait_for_offset(
    client: AsyncLiftbridgeClient, stream: str, partition: int, target: int, *, paused_poll: float = PAUSED_POLL_SECONDS
) -> int:
    """Wait until ``partition``'s high watermark reaches ``target``; return the committed offset seen.

    Checks the partition metadata first (so a target reached long ago returns at once), then
    subscribes from ``target``: subscribers only see committed messages, so the first message
    delivered at or after ``target`` proves the high watermark got there.

    A paused partition is waited out, not resumed: subscribing with ``resume=True`` would undo
    the pause as a side effect, and nothing is committed to a paused partition anyway (a publish
    resumes it). While it is paused the stream metadata's high watermark is read every
    ``paused_poll`` seconds.

    :raises LiftbridgeAirflowError: the partition is (or becomes) read-only before the target.
    :raises LiftbridgeError: the stream or partition does not exist, or the cluster failed.
    """
    while True:
        try:
            info = await client.fetch_partition_metadata(stream, partition)
        except PartitionPausedError:
            high_watermark = await paused_high_watermark(client, stream, partition)
            if high_watermark >= target:
                return high_watermark
            await asyncio.sleep(paused_poll)
            continue
        try:
            return await _subscribe_until(client, stream, partition, target, info)
        except PartitionPausedError:
            await asyncio.sleep(paused_poll)  # paused while waiting: wait it out as above


async def paused_high_watermark(client: AsyncLiftbridgeClient, stream: str, partition: int) -> int:
    """A paused partition's high watermark, from the stream metadata (its leader does not answer
    FetchPartitionMetadata while it is paused)."""
    info = (await client.fetch_metadata([stream])).streams.get(stream)
    part = info.partitions.get(partition) if info is not None else None
    return part.high_watermark if part is not None else -1


async def _subscribe_until(
    client: AsyncLiftbridgeClient, stream: str, partition: int, target: int, info: PartitionInfo
) -> int:
    if info.high_watermark >= target:
        return info.high_watermark
    if info.readonly:
        raise LiftbridgeAirflowError(
            f"stream {stream!r} partition {partition} is read-only at offset {info.high_watermark}: "
            f"offset {target} will never be written"
        )
    async with closing_subscription(client.subscribe(stream, partition=partition, start_at=target)) as messages:
        async for message in messages:
            if message.offset >= target:
                return message.offset
    raise LiftbridgeAirflowError(
        f"the subscription to stream {stream!r} partition {partition} ended before offset {target} "
        "(the partition is read-only, or was deleted)"
    )


class LiftbridgeBaseTrigger(BaseTrigger):
    """Base of the Liftbridge triggers: opens the async hook, runs :meth:`wait`, turns errors into
    error events, closes the client, and yields the one event.

    Subclasses set their attributes in ``__init__`` (validating them), return exactly their
    constructor arguments from :meth:`serialize_args`, and implement :meth:`wait`.

    :param liftbridge_conn_id: the connection to use.
    """

    def __init__(self, *, liftbridge_conn_id: str) -> None:
        super().__init__()
        if not isinstance(liftbridge_conn_id, str) or not liftbridge_conn_id:
            raise LiftbridgeArgumentError(f"liftbridge_conn_id must be a connection id, got {liftbridge_conn_id!r}")
        self.liftbridge_conn_id = liftbridge_conn_id

    def serialize_args(self) -> dict[str, Any]:
        """The constructor arguments, JSON-safe."""
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self.serialize_args()

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        """Wait for the condition and return the success event's payload (without ``status``)."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = LiftbridgeAsyncHook(liftbridge_conn_id=self.liftbridge_conn_id)
        try:
            payload: Mapping[str, Any] = {"status": "success", **await self.wait(hook)}
        except (LiftbridgeError, AirflowException, ValueError, OSError) as exc:
            self.log.warning("%s failed: %s", type(self).__name__, exc)
            payload = {"status": "error", "message": str(exc) or repr(exc), "error_type": type(exc).__name__}
        finally:
            await hook.aclose()
        yield TriggerEvent(dict(payload))
