"""What a reading operator reads, as one value whose type is the mode: ``read=SinceLastRun(...)``,
``read=ConsumerGroup(...)`` or ``read=DataInterval(...)`` on
:class:`~.consume.LiftbridgeConsumeOperator` and :class:`~.stream_to_file.LiftbridgeStreamToFileOperator`.

Each value holds only what its mode uses, so a keyword of another mode cannot be written; its
text fields are templated (Airflow renders the fields a value lists in ``template_fields``). Each
value checks its fields when the DAG is parsed (the literal ones) and once they are rendered, and
builds its mode's strategy (:mod:`airflow_provider_liftbridge.client.reading.strategies`), which
does the reading's planning, resuming, completing and bookkeeping. See ``docs/consume.md``.

The keywords these values replaced are refused with the new form (:func:`reject_old_keywords`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, StartPosition
from airflow_provider_liftbridge.client.consumer import MAX_POLL_INTERVAL
from airflow_provider_liftbridge.client.reading import (
    DEFAULT_LATENESS,
    ConsumerGroupReading,
    DataIntervalReading,
    Interval,
    ReadingStrategy,
    SinceLastRunReading,
    StartSpec,
    TaskRun,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeUnknownArgumentError
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_duration,
    check_name,
    check_non_negative_int,
    check_positive_int,
    check_timeout,
    optional,
    parse_start_at,
    waits_for_rendering,
)

__all__ = [
    "DEFAULT_POLL_TIMEOUT",
    "ConsumerGroup",
    "DataInterval",
    "ReadMode",
    "SinceLastRun",
    "check_read",
    "parse_reading_start",
    "parse_time",
    "reject_old_keywords",
]

#: Seconds to wait for ``min_messages`` (or past an interval's lateness) by default (Kafka's 60).
DEFAULT_POLL_TIMEOUT = 60.0


def parse_reading_start(value: Any, name: str = "start_at") -> StartSpec:
    """``start_at``: ``"earliest"``, ``"latest"`` (``"new_only"`` means the same here), an offset,
    an aware ``datetime``, an ISO 8601 timestamp, or epoch milliseconds as ``"<digits>ms"``.

    :raises LiftbridgeArgumentError: none of those.
    """
    if isinstance(value, str) and value.strip().endswith("ms") and value.strip()[:-2].isdigit():
        return dt.datetime.fromtimestamp(int(value.strip()[:-2]) / 1000, dt.UTC)
    start = parse_start_at(value, name)
    return StartPosition.LATEST if start is StartPosition.NEW_ONLY else start


def parse_time(value: Any, name: str) -> dt.datetime | None:
    """``start_time`` / ``end_time``: an aware ``datetime`` or ISO 8601 text with a time zone
    (what ``{{ data_interval_start }}`` renders to); ``None``/``""``: unset.

    :raises LiftbridgeArgumentError: anything else, or a time without a time zone.
    """
    if value is None or value == "":
        return None
    moment = value
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            moment = None
    if not isinstance(moment, dt.datetime) or moment.tzinfo is None:
        raise bad_argument(
            name, value, "an aware datetime or ISO 8601 text with a time zone", f"e.g. {name}='2026-03-02T10:00:00Z'"
        )
    return moment


def check_lateness(value: Any, name: str = "lateness") -> dt.timedelta:
    """``lateness``: a ``timedelta`` or seconds, 0 or more.

    :raises LiftbridgeArgumentError: anything else.
    """
    lateness = check_duration(value, name)
    if lateness is None:
        raise bad_argument(name, value, "a timedelta or a number of seconds, 0 or more", f"e.g. {name}=60")
    return lateness


class ReadMode:
    """The base of the reading modes: fields as attributes (templated ones in ``template_fields``),
    equality and ``repr`` by fields, checks, and the strategy the mode reads with."""

    #: Every field, in the order of the constructor.
    fields: ClassVar[tuple[str, ...]] = ()
    #: The fields Airflow renders (text that may hold ``{{ ... }}``).
    template_fields: ClassVar[tuple[str, ...]] = ()
    #: Field -> validator (``None``/unset fields included; see :meth:`check`).
    checks: ClassVar[Mapping[str, Any]] = {}
    #: Field -> its default (what ``repr`` leaves out).
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in self.fields)

    __hash__ = None  # type: ignore[assignment]  # mutable: Airflow renders the fields in place

    def __repr__(self) -> str:
        unset = object()
        given = ", ".join(
            f"{f}={getattr(self, f)!r}" for f in self.fields if getattr(self, f) != self.defaults.get(f, unset)
        )
        return f"{type(self).__name__}({given})"

    def copy(self) -> ReadMode:
        """A copy (each task renders its own)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def value(self, name: str) -> Any:
        """The field ``name`` as used (checked and converted).

        :raises LiftbridgeArgumentError: it is not valid.
        """
        return self.checks[name](getattr(self, name), name)

    def check(self, *, rendered: bool) -> None:
        """Check every field (before rendering: those not waiting for it) and their combination.

        :raises LiftbridgeArgumentError: the field at fault is named, with the fix.
        """
        for name in self.fields:
            value = getattr(self, name)
            if rendered or not waits_for_rendering(value):
                self.value(name)

    def strategy(
        self, client: LiftbridgeClient, stream: str, run: TaskRun, log: logging.Logger | None = None
    ) -> ReadingStrategy:
        """The strategy reading ``stream`` this way in the try ``run`` (saying what it does to ``log``)."""
        raise NotImplementedError


#: The validators of the fields both modes by position have.
_POSITION_CHECKS: dict[str, Any] = {
    "start_at": parse_reading_start,
    "max_messages": optional(check_positive_int),
    "min_messages": optional(check_non_negative_int),
    "poll_timeout": lambda v, n: check_timeout(v, n) or DEFAULT_POLL_TIMEOUT,
}
_POSITION_DEFAULTS: dict[str, Any] = {
    "start_at": "earliest",
    "max_messages": None,
    "min_messages": None,
    "poll_timeout": DEFAULT_POLL_TIMEOUT,
}


class _ByPosition(ReadMode):
    """What :class:`SinceLastRun` and :class:`ConsumerGroup` share: the planned range's fields."""

    start_at: Any
    max_messages: Any
    min_messages: Any
    poll_timeout: Any

    def _position(self) -> dict[str, Any]:
        return {name: self.value(name) for name in _POSITION_CHECKS}


class SinceLastRun(_ByPosition):
    """Read what arrived since the last run, from the positions in ``cursor_id``: each run plans,
    per partition, the range from the committed position + 1 to the high watermark, and every
    try of the run reads that range.

    :param cursor_id: the cursor holding this task's positions (needs cursors on the cluster). (templated)
    :param start_at: where a partition starts the first time (no position yet): ``"earliest"``
        (default), ``"latest"`` (only what arrives after the first plan), an offset, a timestamp
        (aware ``datetime``, ISO 8601 text, or ``"<epoch ms>ms"``). (templated)
    :param max_messages: at most this many messages per partition in one run (default: all).
    :param min_messages: wait until at least this many messages are there to read (over the
        task's partitions) before planning; the operator's ``deferrable=True`` waits in the triggerer.
    :param poll_timeout: seconds to wait for ``min_messages`` before the try fails (default 60).
    """

    fields = ("cursor_id", "start_at", "max_messages", "min_messages", "poll_timeout")
    template_fields = ("cursor_id", "start_at")
    defaults = _POSITION_DEFAULTS
    checks = {"cursor_id": check_name, **_POSITION_CHECKS}

    def __init__(
        self,
        cursor_id: str,
        *,
        start_at: Any = "earliest",
        max_messages: int | None = None,
        min_messages: int | None = None,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
    ) -> None:
        self.cursor_id = cursor_id
        self.start_at = start_at
        self.max_messages = max_messages
        self.min_messages = min_messages
        self.poll_timeout = poll_timeout

    def strategy(
        self, client: LiftbridgeClient, stream: str, run: TaskRun, log: logging.Logger | None = None
    ) -> ReadingStrategy:
        return SinceLastRunReading(client, stream, run, cursor_id=self.value("cursor_id"), log=log, **self._position())


class ConsumerGroup(_ByPosition):
    """Read as a member of a consumer group: the partitions the group assigns to the task, from
    the group's positions (then as :class:`SinceLastRun`). The operator's ``partitions`` stays unset.

    :param group_id: the consumer group. (templated)
    :param start_at: / :param max_messages: / :param min_messages: / :param poll_timeout: as for
        :class:`SinceLastRun` (``start_at`` templated).
    :param max_poll_interval: seconds one batch (reading it and the handler) may take before the
        task's member leaves the group (default 300; ``None``: never). Until then the member
        heartbeats on its own, so a batch slower than the group's consumer timeout keeps its
        partitions (``docs/consumer-groups.md``, "What keeps a member alive").
    """

    fields = ("group_id", "start_at", "max_messages", "min_messages", "poll_timeout", "max_poll_interval")
    template_fields = ("group_id", "start_at")
    defaults = _POSITION_DEFAULTS | {"max_poll_interval": MAX_POLL_INTERVAL}
    checks = {"group_id": check_name, **_POSITION_CHECKS, "max_poll_interval": check_timeout}

    def __init__(
        self,
        group_id: str,
        *,
        start_at: Any = "earliest",
        max_messages: int | None = None,
        min_messages: int | None = None,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        max_poll_interval: float | None = MAX_POLL_INTERVAL,
    ) -> None:
        self.group_id = group_id
        self.start_at = start_at
        self.max_messages = max_messages
        self.min_messages = min_messages
        self.poll_timeout = poll_timeout
        self.max_poll_interval = max_poll_interval

    def strategy(
        self, client: LiftbridgeClient, stream: str, run: TaskRun, log: logging.Logger | None = None
    ) -> ReadingStrategy:
        return ConsumerGroupReading(
            client,
            stream,
            run,
            log=log,
            group_id=self.value("group_id"),
            max_poll_interval=self.value("max_poll_interval"),
            **self._position(),
        )


class DataInterval(ReadMode):
    """Read every message whose timestamp is in the run's data interval (on a partitioned run,
    its partition's window; or ``[start_time, end_time)`` where given), found by Liftbridge's time
    index: the same messages in every try, clear and backfill. The task waits until every
    partition is complete for the interval (a committed message at or after the end, or
    ``lateness`` passed with all committed). See ``docs/consume.md``, "Read by interval".

    :param lateness: how long after the end a partition that has no later message counts as
        complete (``timedelta`` or seconds; default 60 s).
    :param start_time: / :param end_time: the interval to read instead of the run's (aware
        datetimes or ISO 8601 text). (templated)
    :param cursor_id: names the progress cursors (default ``"airflow"``). (templated)
    :param poll_timeout: seconds past ``end + lateness`` the wait in the worker may take before
        the try fails (default 60).
    """

    fields = ("lateness", "start_time", "end_time", "cursor_id", "poll_timeout")
    template_fields = ("start_time", "end_time", "cursor_id")
    defaults = {
        "lateness": DEFAULT_LATENESS,
        "start_time": None,
        "end_time": None,
        "cursor_id": None,
        "poll_timeout": DEFAULT_POLL_TIMEOUT,
    }
    checks = {
        "lateness": check_lateness,
        "start_time": parse_time,
        "end_time": parse_time,
        "cursor_id": optional(check_name),
        "poll_timeout": _POSITION_CHECKS["poll_timeout"],
    }

    def __init__(
        self,
        lateness: Any = DEFAULT_LATENESS,
        *,
        start_time: Any = None,
        end_time: Any = None,
        cursor_id: str | None = None,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
    ) -> None:
        self.lateness = lateness
        self.start_time = start_time
        self.end_time = end_time
        self.cursor_id = cursor_id
        self.poll_timeout = poll_timeout

    def check(self, *, rendered: bool) -> None:
        """The fields, and an end after the start when both are given.

        :raises LiftbridgeArgumentError: the field at fault is named, with the fix.
        """
        super().check(rendered=rendered)
        start, end = self.start_time, self.end_time
        if start in (None, "") or end in (None, ""):
            return
        if not rendered and (waits_for_rendering(start) or waits_for_rendering(end)):
            return
        try:
            Interval(self.value("start_time"), self.value("end_time"))
        except InvalidArgumentError as exc:
            raise LiftbridgeArgumentError(f"start_time={start!r}, end_time={end!r}: {exc}") from None

    def uses_run_window(self) -> bool:
        """Whether the run's window gives a bound (``start_time`` or ``end_time`` not given)."""
        return self.value("start_time") is None or self.value("end_time") is None

    def strategy(
        self, client: LiftbridgeClient, stream: str, run: TaskRun, log: logging.Logger | None = None
    ) -> ReadingStrategy:
        try:
            return DataIntervalReading(
                client,
                stream,
                run,
                log=log,
                start=self.value("start_time"),
                end=self.value("end_time"),
                cursor_id=self.value("cursor_id"),
                lateness=self.value("lateness"),
                poll_timeout=self.value("poll_timeout"),
            )
        except InvalidArgumentError as exc:
            raise LiftbridgeArgumentError(f"{run.task_id}: {exc}") from None


def check_read(value: Any, name: str = "read") -> ReadMode:
    """``read``: a :class:`SinceLastRun`, :class:`ConsumerGroup` or :class:`DataInterval` value.

    :raises LiftbridgeArgumentError: anything else, naming the three.
    """
    if not isinstance(value, ReadMode):
        raise bad_argument(
            name,
            value,
            "a SinceLastRun, ConsumerGroup or DataInterval value",
            f"e.g. {name}=SinceLastRun('orders-reader'), {name}=ConsumerGroup('billing') or {name}=DataInterval()",
        )
    return value


# -- the keywords the modes replaced ------------------------------------------------------------------

#: Keywords of each mode's old form, as the mode's field names.
_MODE_KEYWORDS = {
    "cursor_id": "cursor_id",
    "group_id": "group_id",
    "start_at": "start_at",
    "max_messages": "max_messages",
    "min_messages": "min_messages",
    "poll_timeout": "poll_timeout",
    "max_poll_interval": "max_poll_interval",
    "read_by": None,
    "start_time": "start_time",
    "end_time": "end_time",
    "allowed_lateness": "lateness",
}
_DEAD_LETTER_KEYWORDS = ("on_error", "dead_letter_stream", "create_dead_letter_stream")
#: Old keyword -> its new form, for the keywords a single new one replaced.
_RENAMED = {"max_batch_size": "batch_size", "max_rows_per_file": "batch_size"}
#: Old archive keywords -> the field of the file format value that took them.
FORMAT_KEYWORDS = {
    "parquet_compression": "compression",
    "row_group_rows": "row_group_rows",
    "json_schema": "json_schema",
}
#: Every keyword the reading operators took before and take no more.
OLD_KEYWORDS = (
    frozenset(_MODE_KEYWORDS) | frozenset(_DEAD_LETTER_KEYWORDS) | frozenset(_RENAMED) | frozenset(FORMAT_KEYWORDS)
)


def _call(name: str, given: Mapping[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in given.items())})"


def _mode_form(old: Mapping[str, Any]) -> str | None:
    fields = {_MODE_KEYWORDS[k]: v for k, v in old.items() if k in _MODE_KEYWORDS and _MODE_KEYWORDS[k]}
    if not fields and "read_by" not in old:
        return None
    interval = old.get("read_by") == "interval" or any(k in fields for k in ("start_time", "end_time", "lateness"))
    if interval:
        kept = ("lateness", "start_time", "end_time", "cursor_id", "poll_timeout")
        return "read=" + _call("DataInterval", {k: fields[k] for k in kept if k in fields})
    if "group_id" in fields:
        kept = ("group_id", *ConsumerGroup.fields[1:])
        return "read=" + _call("ConsumerGroup", {k: fields[k] for k in kept if k in fields})
    given = {k: fields[k] for k in SinceLastRun.fields if k in fields}
    call = _call("SinceLastRun", given)
    return "read=" + (
        call if "cursor_id" in given else call.replace("(", "(cursor_id=..., " if given else "(cursor_id=...", 1)
    )


def _dead_letter_form(old: Mapping[str, Any]) -> str | None:
    if not any(k in old for k in _DEAD_LETTER_KEYWORDS):
        return None
    if old.get("on_error", "dead_letter") == "fail" or not old.get("dead_letter_stream"):
        return "no dead_letters (a failure fails the task)"
    create = ", create=True" if old.get("create_dead_letter_stream") else ""
    return f"dead_letters=DeadLetterStream({old['dead_letter_stream']!r}{create})"


def reject_old_keywords(operator: str, task_id: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse the keywords the reading modes, ``dead_letters``, ``batch_size`` and the archive's
    file format values replaced, with the new form of what was written.

    :raises LiftbridgeUnknownArgumentError: one of them was given (a ``TypeError`` and a
        ``ValueError``), e.g. "use read=DataInterval(lateness=60) instead of read_by='interval',
        allowed_lateness=60".
    """
    old = {k: v for k, v in kwargs.items() if k in OLD_KEYWORDS}
    if not old:
        return
    forms: list[tuple[str, list[str]]] = []
    mode = _mode_form(old)
    if mode:
        forms.append((mode, [k for k in old if k in _MODE_KEYWORDS]))
    dead = _dead_letter_form(old)
    if dead:
        forms.append((dead, [k for k in old if k in _DEAD_LETTER_KEYWORDS]))
    for name, new in _RENAMED.items():
        if name in old:
            forms.append((f"{new}={old[name]!r}", [name]))
    formats = {FORMAT_KEYWORDS[k]: v for k, v in old.items() if k in FORMAT_KEYWORDS}
    if formats:
        forms.append(
            (
                f"format={_call('Parquet', formats)} (or Csv(...), JsonLines(...))",
                [k for k in old if k in FORMAT_KEYWORDS],
            )
        )
    said = "; ".join(f"use {new} instead of {', '.join(f'{k}={old[k]!r}' for k in names)}" for new, names in forms)
    raise LiftbridgeUnknownArgumentError(
        f"{operator} (task_id {task_id!r}): {said} (see CHANGELOG.md, 'Reading operators')"
    )
