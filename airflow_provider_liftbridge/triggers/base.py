"""What the Liftbridge triggers share: the async hook's lifetime, error events, JSON-safe
messages, start positions and the offset waiter.

Every trigger yields exactly one event, ``{"status": "success", ...}`` or
``{"status": "error", "message": ..., "error_type": ...}``, and closes its client before yielding.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeError, Message, StartPosition
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.hooks.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError

__all__ = [
    "LiftbridgeBaseTrigger",
    "check_partition",
    "check_stream",
    "closing_subscription",
    "jsonable",
    "message_to_json",
    "parse_start_at",
    "wait_for_offset",
]

_T = TypeVar("_T")

START_NAMES = {p.value: p for p in StartPosition}


def check_stream(value: Any) -> str:
    """A stream name: a non-empty string.

    :raises LiftbridgeArgumentError: not a string, or empty.
    """
    if not isinstance(value, str) or not value:
        raise LiftbridgeArgumentError(f"stream must be a stream name, got {value!r}")
    return value


def check_partition(value: Any, what: str = "partition") -> int:
    """A partition number (``int`` or digit string).

    :raises LiftbridgeArgumentError: not a non-negative whole number.
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise LiftbridgeArgumentError(f"{what} must be a partition number, got {value!r}") from None
    if number < 0:
        raise LiftbridgeArgumentError(f"{what} must not be negative, got {value!r}")
    return number


def parse_start_at(value: Any) -> StartPosition | int | dt.datetime:
    """Read a start position: an offset (``int`` or digits), ``"earliest"``, ``"latest"``,
    ``"new_only"``, a :class:`StartPosition`, or an ISO 8601 timestamp (naive means UTC).

    :raises LiftbridgeArgumentError: none of those.
    """
    if isinstance(value, StartPosition):
        return value
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise LiftbridgeArgumentError(f"start offset must not be negative, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        if text.lower() in START_NAMES:
            return START_NAMES[text.lower()]
        try:
            return parse_start_at(dt.datetime.fromisoformat(text))
        except ValueError:
            pass
    raise LiftbridgeArgumentError(
        f"start_at {value!r} is not an offset, 'earliest', 'latest', 'new_only' or an ISO 8601 timestamp"
    )


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


async def wait_for_offset(client: AsyncLiftbridgeClient, stream: str, partition: int, target: int) -> int:
    """Wait until ``partition``'s high watermark reaches ``target``; return the committed offset seen.

    Checks the partition metadata first (so a target reached long ago returns at once), then
    subscribes from ``target``: subscribers only see committed messages, so the first message
    delivered at or after ``target`` proves the high watermark got there. No polling.

    :raises LiftbridgeAirflowError: the partition is (or becomes) read-only before the target.
    :raises LiftbridgeError: the stream or partition does not exist, or the cluster failed.
    """
    info = await client.fetch_partition_metadata(stream, partition)
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
