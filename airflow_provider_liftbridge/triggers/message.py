"""``LiftbridgeMessageTrigger``: fires on the first message an apply function accepts."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk.module_loading import import_string

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.hooks.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.hooks.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError

from .base import (
    LiftbridgeBaseTrigger,
    check_partition,
    check_stream,
    closing_subscription,
    jsonable,
    message_to_json,
    parse_start_at,
)

__all__ = ["LiftbridgeMessageTrigger", "apply_to_message", "resolve_apply_function"]


def resolve_apply_function(path: Any) -> Callable[..., Any]:
    """Import the apply function named by a dotted path.

    :raises LiftbridgeArgumentError: not a dotted path, not importable, or not callable.
    """
    if not isinstance(path, str) or "." not in path:
        raise LiftbridgeArgumentError(
            f"apply_function must be a dotted path such as 'my_pkg.filters.is_ready', got {path!r}"
        )
    try:
        func = import_string(path)
    except ImportError as exc:
        raise LiftbridgeArgumentError(f"apply_function {path!r} cannot be imported: {exc}") from None
    if not callable(func):
        raise LiftbridgeArgumentError(f"apply_function {path!r} is not callable")
    return func  # type: ignore[no-any-return]


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
    :param apply_function: dotted path of the function, imported where the trigger runs.
    :param partition: the partition.
    :param start_at: an offset, ``"earliest"``, ``"latest"``, ``"new_only"`` or an ISO 8601 timestamp.
    :param apply_function_args: / :param apply_function_kwargs: extra arguments of the function.
    :param liftbridge_conn_id: the connection to use.
    :raises LiftbridgeArgumentError: an argument is invalid (constructor; the function is imported
        there too, so a wrong path fails before deferring).
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
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.stream = check_stream(stream)
        self.apply_function = apply_function
        self._function = resolve_apply_function(apply_function)
        self.partition = check_partition(partition)
        parse_start_at(start_at)  # validate; kept as given so serialize() returns it unchanged
        self.start_at = start_at
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "apply_function": self.apply_function,
            "partition": self.partition,
            "start_at": self.start_at,
            "apply_function_args": self.apply_function_args,
            "apply_function_kwargs": self.apply_function_kwargs,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        client = await hook.get_async_client()
        subscription = client.subscribe(self.stream, partition=self.partition, start_at=parse_start_at(self.start_at))
        async with closing_subscription(subscription) as messages:
            async for message in messages:
                result = apply_to_message(
                    self._function, self.apply_function, message, self.apply_function_args, self.apply_function_kwargs
                )
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return match_event(message, result)
        raise LiftbridgeAirflowError(
            f"the subscription to stream {self.stream!r} partition {self.partition} ended without a matching "
            "message (the partition is read-only, or was deleted)"
        )
