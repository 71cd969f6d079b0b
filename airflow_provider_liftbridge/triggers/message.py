"""``LiftbridgeMessageTrigger``: fires on the first message an apply function accepts."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_provider_liftbridge.callables import TRIGGERER
from airflow_provider_liftbridge.client import Message, StartPosition
from airflow_provider_liftbridge.client.consumer import AutoOffset
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import (
    check_function_path,
    check_partition,
    check_stream,
    import_function,
    parse_start_at,
)

from .base import LiftbridgeBaseTrigger, closing_subscription, jsonable, message_to_json

__all__ = ["LiftbridgeMessageTrigger", "apply_to_message", "group_auto_offset"]

_AUTO_OFFSET_OF = {
    StartPosition.EARLIEST: "earliest",
    StartPosition.LATEST: "latest",
    StartPosition.NEW_ONLY: "new_only",
}


def group_auto_offset(start_at: Any) -> AutoOffset:
    """Where a consumer-group member starts a partition the group has no position for, from a
    sensor's ``start_at`` (``"earliest"``, ``"latest"`` or ``"new_only"``).

    :raises LiftbridgeArgumentError: an offset or a timestamp (a group reads many partitions).
    """
    start = parse_start_at(start_at)
    if not isinstance(start, StartPosition):
        raise LiftbridgeArgumentError(
            f"with a consumer_group, start_at must be 'earliest', 'latest' or 'new_only' (where the group starts"
            f" partitions it has no position for), not {start_at!r}"
        )
    return _AUTO_OFFSET_OF[start]  # type: ignore[return-value]


def apply_to_message(
    func: Callable[..., Any], name: str, message: Message, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Call the apply function, turning its failure into an error naming it and the offset.

    :raises LiftbridgeAirflowError: the function raised.
    """
    try:
        return func(message, *args, **kwargs)
    except Exception as exc:
        raise LiftbridgeAirflowError(
            f"apply_function {name!r} raised on offset {message.offset}: {type(exc).__name__}: {exc}"
        ) from exc


def match_event(message: Message, result: Any) -> dict[str, Any]:
    """The success payload: the message (JSON-safe) and what the function returned (unless ``True``)."""
    return {"message": message_to_json(message), "match": None if result is True else jsonable(result)}


class LiftbridgeMessageTrigger(LiftbridgeBaseTrigger):
    """Subscribe to a partition from ``start_at`` and fire on the first message for which
    ``apply_function(message, *apply_function_args, **apply_function_kwargs)`` returns something
    truthy. The function gets a :class:`~airflow_provider_liftbridge.client.Message` (bytes
    ``key``/``value``, ``headers``, ``offset``, ...); it runs in the triggerer's event loop, so it
    must be quick and must not block (it may be ``async``).

    Success event: ``{"status": "success", "message": {...}, "match": ...}``; ``message`` is
    JSON-safe (bytes as base64, ``value_text`` when UTF-8), ``match`` is the function's result
    unless it was ``True``.

    :param stream: the stream.
    :param apply_function: dotted path of the function: its shape is checked here, and it is
        imported in the triggerer when the trigger runs (before subscribing); a module missing there
        gives an error event naming the path, the cause and that it must be importable on the triggerer.
    :param partition: the partition.
    :param start_at: an offset, ``"earliest"``, ``"latest"``, ``"new_only"`` or an ISO 8601 timestamp.
    :param apply_function_args: / :param apply_function_kwargs: extra arguments of the function.
    :param liftbridge_conn_id: the connection to use.
    :param consumer_group: read as a member of this Liftbridge consumer group instead of one
        partition: the group's coordinator assigns this trigger some partitions of the stream, other
        members (other triggers, DAGs) get the others, and no partition is read by two members at
        once. Messages looked at count as consumed by the group (positions committed as cursors);
        at a match the trigger commits and leaves. ``partition`` is then ignored and ``start_at``
        (``"earliest"``, ``"latest"``, ``"new_only"``) applies to partitions the group has no position for.
    :param consumer_id: this member's id in the group (stable across triggerer restarts).
    :raises LiftbridgeArgumentError: an argument is invalid (constructor; the function is not
        imported there: the sensor imports it on the worker before deferring).
    """

    def __init__(
        self,
        *,
        stream: str,
        apply_function: str,
        partition: int = 0,
        start_at: int | str = "earliest",
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
        consumer_group: str | None = None,
        consumer_id: str | None = None,
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.stream = check_stream(stream)
        check_function_path(apply_function, "apply_function")
        self.apply_function = apply_function
        self._function: Callable[..., Any] | None = None  # imported where the trigger runs
        self.partition = check_partition(partition)
        parse_start_at(start_at)  # validate; kept as given so serialize() returns it unchanged
        self.start_at = start_at
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.consumer_group = consumer_group or None
        self.consumer_id = consumer_id or None
        if self.consumer_group:
            group_auto_offset(start_at)

    def serialize_args(self) -> dict[str, Any]:
        group = {"consumer_group": self.consumer_group, "consumer_id": self.consumer_id} if self.consumer_group else {}
        return group | {
            "stream": self.stream,
            "apply_function": self.apply_function,
            "partition": self.partition,
            "start_at": self.start_at,
            "apply_function_args": self.apply_function_args,
            "apply_function_kwargs": self.apply_function_kwargs,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    def _import_function(self) -> Callable[..., Any]:
        """The apply function, imported in this process (the triggerer) the first time.

        :raises LiftbridgeArgumentError: it cannot be imported (names the path and the cause).
        """
        if self._function is None:
            self._function = import_function(self.apply_function, "apply_function", TRIGGERER)
        return self._function

    async def _matches(self, message: Message) -> Any:
        result = apply_to_message(
            self._import_function(), self.apply_function, message, self.apply_function_args, self.apply_function_kwargs
        )
        return (await result) if inspect.isawaitable(result) else result

    async def _wait_in_group(self, hook: LiftbridgeAsyncHook, group: str) -> dict[str, Any]:
        consumer = (await hook.get_async_client()).group_consumer(
            group,
            self.stream,
            consumer_id=self.consumer_id,
            auto_offset=group_auto_offset(self.start_at),
        )
        try:
            await consumer.join()
            async for message in consumer.messages():
                result = await self._matches(message)
                if result:
                    await consumer.commit()  # the match and what came before it are the group's
                    return match_event(message, result)
        finally:
            # Leaving hands this member's partitions to the others at once (a cancelled wait too).
            await consumer.leave()
        raise AssertionError("unreachable: a group's messages() only ends when the caller stops")

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        self._import_function()  # before joining or subscribing: a missing module reads nothing
        if self.consumer_group:
            return await self._wait_in_group(hook, self.consumer_group)
        client = await hook.get_async_client()
        subscription = client.subscribe(self.stream, partition=self.partition, start_at=parse_start_at(self.start_at))
        async with closing_subscription(subscription) as messages:
            async for message in messages:
                result = await self._matches(message)
                if result:
                    return match_event(message, result)
        raise LiftbridgeAirflowError(
            f"the subscription to stream {self.stream!r} partition {self.partition} ended without a matching "
            "message (the partition is read-only, or was deleted)"
        )
