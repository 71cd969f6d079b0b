"""``LiftbridgeMessageSensor``: wait for a message an apply function accepts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context, PokeReturnValue

from airflow_provider_liftbridge.client import GroupConsumer, StartPosition
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.triggers.message import (
    LiftbridgeMessageTrigger,
    apply_to_message,
    group_auto_offset,
    match_event,
)
from airflow_provider_liftbridge.validation import (
    check_bool,
    check_function_path,
    check_optional_name,
    check_partition,
    check_start_at,
    check_stream,
    import_function,
    parse_start_at,
)

from .base import LiftbridgeBaseSensor

__all__ = ["LiftbridgeMessageSensor"]


class LiftbridgeMessageSensor(LiftbridgeLineageMixin, LiftbridgeBaseSensor):
    """Wait for the first message of a partition that ``apply_function`` accepts, and return it.

    Where reading starts:

    - with ``cursor_id``, after the cursor's offset when the cursor is set (else at ``start_at``);
      after success the cursor moves to the matched message (``commit_cursor``), and only then,
      so a failed or timed-out wait never skips messages;
    - otherwise at ``start_at``: an offset, ``"earliest"``, ``"latest"``, ``"new_only"`` or an ISO
      8601 timestamp. ``"latest"`` and ``"new_only"`` are pinned to an offset when the task starts,
      so messages published while the task defers are not missed.

    ``apply_function`` is a dotted path to ``f(message, *args, **kwargs)``; a truthy result is a
    match. It is checked for its shape when the DAG is parsed and imported where it runs: on the
    worker when the task starts (before anything is read), and in the triggerer when it defers.
    The message is a :class:`~airflow_provider_liftbridge.client.Message`. See
    :mod:`airflow_provider_liftbridge.sensors.matchers` for ready-made functions.

    :param stream: the stream. (templated)
    :param apply_function: dotted path of the function. (templated)
    :param partition: the partition. (templated)
    :param start_at: where to start without a cursor. (templated)
    :param cursor_id: a Liftbridge cursor to start after and to move on success (the cluster must
        have cursors enabled, else ``CursorsDisabledError``). (templated)
    :param commit_cursor: move the cursor to the matched message (default true).
    :param apply_function_args: / :param apply_function_kwargs: extra arguments. (templated)
    :param liftbridge_conn_id: the connection to use. (templated)
    :param consumer_group: read as a member of this Liftbridge consumer group instead of one
        partition, so several sensors, triggerers or DAGs share the stream's partitions and none is
        read twice; messages looked at count as consumed by the group, and at a match the member
        commits and leaves. ``partition`` and ``cursor_id`` do not apply; ``start_at`` (``"earliest"``,
        ``"latest"``, ``"new_only"``) is where partitions without a group position start. (templated)
    :param consumer_id: the member id (default ``dag_id.task_id.run_id.map_index``, so a rescheduled
        or restarted wait takes its own place again). (templated)
    :param deferrable: wait in the triggerer.
    :return: ``{"message": {stream, partition, offset, timestamp, subject, reply_subject, key, value,
        value_text, headers}, "match": ...}`` with bytes as base64.
    :raises LiftbridgeArgumentError: an invalid argument (bad dotted path, start position, ...), or a
        function that cannot be imported on the worker.
    """

    template_fields: Sequence[str] = (
        "stream",
        "apply_function",
        "partition",
        "start_at",
        "cursor_id",
        "apply_function_args",
        "apply_function_kwargs",
        "liftbridge_conn_id",
        "consumer_group",
        "consumer_id",
    )
    argument_checks = {
        "stream": check_stream,
        "apply_function": check_function_path,
        "partition": check_partition,
        "start_at": check_start_at,
        "cursor_id": check_optional_name,
        "commit_cursor": check_bool,
        "consumer_group": check_optional_name,
        "consumer_id": check_optional_name,
    }
    function_arguments = ("apply_function",)

    def __init__(
        self,
        *,
        stream: str,
        apply_function: str,
        partition: int = 0,
        start_at: int | str = "earliest",
        cursor_id: str | None = None,
        commit_cursor: bool = True,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        consumer_group: str | None = None,
        consumer_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.consumer_group = consumer_group
        self.consumer_id = consumer_id
        self._group: GroupConsumer | None = None
        self.stream = stream
        self.apply_function = apply_function
        self.partition = partition
        self.start_at = start_at
        self.cursor_id = cursor_id
        self.commit_cursor = commit_cursor
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self._start: int | str = "earliest"
        self._next_offset: int | None = None

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the stream."""
        return [self.lineage_stream(self.stream)], []

    def _member_id(self, context: Context) -> str:
        if self.consumer_id:
            return self.consumer_id
        ti = context["ti"]
        return f"{ti.dag_id}.{ti.task_id}.{context['run_id']}.{getattr(ti, 'map_index', -1)}"

    def prepare(self, context: Context) -> None:
        if self.consumer_group:
            if self.cursor_id:
                raise LiftbridgeArgumentError(
                    "cursor_id and consumer_group exclude each other: a group keeps its own positions; drop one"
                )
            self._start = group_auto_offset(self.start_at)
            self.consumer_id = self._member_id(context)
            self.log.info(
                "Looking for a matching message in %r as member %r of consumer group %r",
                self.stream,
                self.consumer_id,
                self.consumer_group,
            )
            return
        partition = check_partition(self.partition)
        self.partition = partition
        start = parse_start_at(self.start_at)
        client = self.hook.client
        if self.cursor_id:
            cursor = client.fetch_cursor(self.cursor_id, self.stream, partition)
            if cursor >= 0:
                self.log.info("Cursor %r is at offset %d: starting after it", self.cursor_id, cursor)
                start = cursor + 1
        if start in (StartPosition.LATEST, StartPosition.NEW_ONLY):
            # Pin to an offset now, so nothing published while deferring is missed.
            high_watermark = client.fetch_partition_metadata(self.stream, partition).high_watermark
            start = max(high_watermark, 0) if start is StartPosition.LATEST else high_watermark + 1
        if isinstance(start, StartPosition):
            self._start = start.value
        elif isinstance(start, dt.datetime):
            self._start = start.isoformat()
        else:
            self._start = start
        self.log.info("Looking for a matching message in %r partition %d from %s", self.stream, partition, self._start)

    def check_before_deferring(self, context: Context) -> PokeReturnValue | bool:
        """One read of what is committed now (one poke). Without a match the trigger goes on after
        what the check read; a group member commits what it looked at and leaves, so the trigger
        can join as the same member."""
        try:
            result = self.poke(context)
        finally:
            if self._group is not None and self._group.member.joined:
                self._group.leave()
        if not result and not self.consumer_group and self._next_offset is not None:
            self._start = self._next_offset
        return result

    def make_trigger(self, context: Context) -> LiftbridgeMessageTrigger:
        return LiftbridgeMessageTrigger(
            stream=self.stream,
            apply_function=self.apply_function,
            partition=int(self.partition),
            start_at=self._start,
            apply_function_args=self.apply_function_args,
            apply_function_kwargs=self.apply_function_kwargs,
            liftbridge_conn_id=self.liftbridge_conn_id,
            **self._group_args(),
        )

    def _group_args(self) -> dict[str, Any]:
        if not self.consumer_group:
            return {}
        return {"consumer_group": self.consumer_group, "consumer_id": self.consumer_id}

    def _poke_in_group(self, context: Context, group: str) -> PokeReturnValue | bool:
        """One poll as a group member: what is committed now on this member's partitions."""
        if self._group is None:
            self._group = self.hook.client.group_consumer(
                group,
                self.stream,
                consumer_id=self.consumer_id,
                auto_offset=group_auto_offset(self.start_at),
                auto_commit_interval=None,
                # A poke is one look at what is committed now; with a hand-over wait it would see
                # nothing of its partitions (a rescheduled sensor joins anew at every poke).
                handover=False,
            )
        func = import_function(self.apply_function, "apply_function")
        args, kwargs = self.apply_function_args or (), self.apply_function_kwargs or {}
        try:
            for message in self._group.messages(timeout=0):
                result = apply_to_message(func, self.apply_function, message, args, kwargs)
                if result:
                    self._group.commit()
                    self._group.leave()
                    return PokeReturnValue(
                        is_done=True, xcom_value=self.complete(context, match_event(message, result))
                    )
        finally:
            if self._group.member.joined:
                self._group.commit()  # what this poke looked at is the group's: others go on after it
        return False

    def poke(self, context: Context) -> PokeReturnValue | bool:
        if self.consumer_group:
            return self._poke_in_group(context, self.consumer_group)
        client = self.hook.client
        partition = int(self.partition)
        high_watermark = client.fetch_partition_metadata(self.stream, partition).high_watermark
        start: Any = self._next_offset if self._next_offset is not None else parse_start_at(self._start)
        if high_watermark < 0 or (isinstance(start, int) and start > high_watermark):
            return False  # nothing new committed since the last poke
        func = import_function(self.apply_function, "apply_function")
        args, kwargs = self.apply_function_args or (), self.apply_function_kwargs or {}
        messages = client.subscribe(self.stream, partition=partition, start_at=start, stop_at=high_watermark)
        try:
            for message in messages:
                self._next_offset = message.offset + 1
                result = apply_to_message(func, self.apply_function, message, args, kwargs)
                if result:
                    payload = self.complete(context, match_event(message, result))
                    return PokeReturnValue(is_done=True, xcom_value=payload)
        finally:
            close = getattr(messages, "close", None)
            if close is not None:
                close()  # ends the server stream when we stop reading early
        return False

    def complete(self, context: Context, payload: dict[str, Any]) -> dict[str, Any]:
        if self.cursor_id and self.commit_cursor:
            offset = int(payload["message"]["offset"])
            self.hook.client.set_cursor(self.cursor_id, self.stream, int(self.partition), offset)
            self.log.info("Cursor %r moved to offset %d", self.cursor_id, offset)
        return payload
