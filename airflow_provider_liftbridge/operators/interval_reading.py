"""Reading by interval in the reading operators (``read_by="interval"``): which interval a run
reads, the wait until every partition is complete for it (in the worker or the triggerer), and
the plan (:class:`~airflow_provider_liftbridge.client.reading.IntervalPlanner`). The batched read,
the commits and the XCom are the reading operator's, shared with reading by position.
See ``docs/consume.md``, "Read by interval".
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from airflow.sdk import Context

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient
from airflow_provider_liftbridge.client.reading import (
    Interval,
    IntervalBounds,
    IntervalPlanner,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.interval import LiftbridgeIntervalTrigger
from airflow_provider_liftbridge.validation import bad_argument, check_duration, waits_for_rendering

from .deferral import defer_unless_reached
from .partitions import partition_of, partition_window


class LiftbridgeReadingOperator(Protocol):
    """What this module uses of a reading operator (:class:`~.reading_base.LiftbridgeReadingOperator`)."""

    task_id: str
    stream: str
    partitions: Any
    cursor_id: str | None
    group_id: str | None
    min_messages: Any
    max_messages: Any
    start_at: Any
    read_by: str
    start_time: Any
    end_time: Any
    allowed_lateness: Any
    deferrable: bool
    liftbridge_conn_id: str
    log: Any

    @property
    def _poll_timeout(self) -> float: ...

    def defer(self, **kwargs: Any) -> None: ...


__all__ = [
    "READ_BY",
    "check_lateness",
    "check_read_by_arguments",
    "interval_of",
    "parse_time",
    "wait_for_interval",
]

#: How a reading task chooses its range: ``position`` (what arrived since the last run, the
#: default) or ``interval`` (the messages whose timestamps fall in the run's interval).
READ_BY = ("position", "interval")
#: Seconds between two looks at the stream while waiting for an interval in the worker.
INTERVAL_POLL = 1.0


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


def check_lateness(value: Any, name: str = "allowed_lateness") -> timedelta:
    """``allowed_lateness``: a ``timedelta`` or seconds, 0 or more.

    :raises LiftbridgeArgumentError: anything else.
    """
    lateness = check_duration(value, name)
    if lateness is None:
        raise bad_argument(name, value, "a timedelta or a number of seconds, 0 or more", f"e.g. {name}=60")
    return lateness


def check_read_by_arguments(task: LiftbridgeReadingOperator, *, rendered: bool) -> None:
    """What ``read_by`` allows with the other arguments: no consumer group and ``end_time`` after
    ``start_time`` with ``interval``; no ``start_time``/``end_time`` with ``position``.

    :raises LiftbridgeArgumentError: the argument at fault is named, with the fix.
    """
    if task.read_by != "interval":
        given = [n for n in ("start_time", "end_time") if getattr(task, n) not in (None, "")]
        if given and task.read_by == "position":
            verb = "apply" if len(given) > 1 else "applies"
            raise LiftbridgeArgumentError(
                f"{' and '.join(given)} {verb} only to read_by='interval'; with read_by='position' the task reads"
                " what arrived since its last run: set read_by='interval', or leave them out"
            )
        return
    if task.group_id:
        raise LiftbridgeArgumentError(
            "read_by='interval' cannot be combined with group_id: an interval is read whole by one task, from "
            "its own progress cursors, while a consumer group shares partitions by position; give cursor_id "
            "(or nothing) instead of group_id, or read_by='position'"
        )
    unused = [
        f"{name}={getattr(task, name)!r}"
        for name, unset in (("min_messages", None), ("max_messages", None), ("start_at", "earliest"))
        if getattr(task, name, unset) not in (unset, "")
    ]
    if unused:
        raise LiftbridgeArgumentError(
            f"{', '.join(unused)}: not used with read_by='interval' (the interval says what is read and the task "
            "waits until it is complete): leave them out, or read_by='position'"
        )
    start, end = task.start_time, task.end_time
    if start in (None, "") or end in (None, ""):
        return
    if not rendered and (waits_for_rendering(start) or waits_for_rendering(end)):
        return
    try:
        Interval(parse_time(start, "start_time"), parse_time(end, "end_time"))  # type: ignore[arg-type]
    except InvalidArgumentError as exc:
        raise LiftbridgeArgumentError(f"start_time={start!r}, end_time={end!r}: {exc}") from None


def interval_of(task: LiftbridgeReadingOperator, context: Context) -> Interval:
    """The interval this run reads: ``start_time`` / ``end_time`` where given, else on a
    partitioned run (``CronPartitionTimetable``) the partition's window (its time to the
    schedule's next time, see :mod:`.partitions`), else the run's data interval.

    :raises LiftbridgeArgumentError: no interval (a run without a data interval or a partition
        and no times given), a partition key naming no time or a timetable with no next time
        (and no times given), or an end not after the start.
    """
    start = parse_time(task.start_time, "start_time")
    end = parse_time(task.end_time, "end_time")
    if start is None or end is None:
        partition = partition_of(context)
        if partition is not None:
            window = partition_window(context, partition)
        else:
            window = (context.get("data_interval_start"), context.get("data_interval_end"))  # type: ignore[assignment]
        start, end = start or window[0], end or window[1]
    if start is None or end is None:
        raise LiftbridgeArgumentError(
            "read_by='interval' needs an interval: this run has no data interval (an unscheduled DAG, or an "
            "asset-triggered run) and no partition key; give start_time and end_time"
        )
    try:
        return Interval(start, end)
    except InvalidArgumentError as exc:
        raise LiftbridgeArgumentError(f"{task.task_id}: {exc}") from None


def wait_for_interval(
    task: LiftbridgeReadingOperator,
    client: LiftbridgeClient,
    context: Context,
    partitions: list[int] | None,
    plan_key: str,
) -> tuple[IntervalPlanner, list[int]]:
    """The run's interval planner and partitions, once every partition is complete for the interval.

    :raises TaskDeferred: ``deferrable`` and not complete yet.
    :raises LiftbridgeAirflowError: not complete within the end + lateness + ``poll_timeout`` (in
        the worker).
    :raises NoTimestampsError: a partition's messages have no usable timestamps (nothing read).
    """
    interval = interval_of(task, context)
    planner = IntervalPlanner(
        client,
        task.stream,
        cursor_prefix=str(task.cursor_id or "airflow"),
        plan_key=plan_key,
        interval=interval,
        lateness=check_lateness(task.allowed_lateness),
        now_ns=_clock_not_behind(getattr(task, "trigger_clock_ns", None)),
    )
    chosen = planner.check_partitions(partitions)
    task.log.info(
        "Reading stream %r partitions %s by interval [%s, %s) (allowed lateness %s)",
        task.stream,
        chosen,
        interval.start.isoformat(),
        interval.end.isoformat(),
        planner.lateness,
    )
    _wait_until_complete(task, planner, chosen)
    return planner, chosen


def _clock_not_behind(floor_ns: Any) -> Callable[[], int]:
    """The worker's clock, never behind ``floor_ns`` (the triggerer's clock when its interval
    trigger fired): the trigger found the lateness passed, so the resumed task must too, even on
    a host whose clock is a little behind the triggerer's (it would otherwise defer again)."""
    floor = floor_ns if isinstance(floor_ns, int) and not isinstance(floor_ns, bool) else 0
    return lambda: max(time.time_ns(), floor)


def _wait_until_complete(task: LiftbridgeReadingOperator, planner: IntervalPlanner, partitions: list[int]) -> None:
    """Return once every partition is complete for the interval; defer or poll until then."""
    if task.deferrable:
        waiting: list[IntervalBounds] = []

        def complete() -> bool:
            waiting[:] = planner.incomplete(partitions)
            return not waiting

        def trigger() -> LiftbridgeIntervalTrigger:
            bounds = waiting or planner.incomplete(partitions) or [planner.bounds(p) for p in partitions]
            task.log.info(
                "partition(s) %s not complete for the interval (high watermarks %s): waiting in the triggerer for "
                "a committed message at or after the end, or the end of the allowed lateness",
                [b.partition for b in bounds],
                [b.high_watermark for b in bounds],
            )
            return LiftbridgeIntervalTrigger(
                stream=task.stream,
                partitions=[b.partition for b in bounds],
                end_ns=planner.interval.end_ns,
                lateness_ns=planner.lateness_ns,
                liftbridge_conn_id=task.liftbridge_conn_id,
            )

        defer_unless_reached(task, check=complete, trigger=trigger, method_name="execute_complete")
        return
    deadline_ns = max(planner.complete_at_ns, time.time_ns()) + int(task._poll_timeout * 1e9)
    logged = False
    while True:
        waiting = planner.incomplete(partitions)
        if not waiting:
            return
        if not logged:
            task.log.info(
                "partition(s) %s not complete for the interval yet: waiting for a later message or the end of the "
                "allowed lateness",
                [b.partition for b in waiting],
            )
            logged = True
        if time.time_ns() >= deadline_ns:
            raise LiftbridgeAirflowError(
                f"stream {task.stream!r} partition(s) {[b.partition for b in waiting]} were not complete for the "
                f"interval {planner.interval.key} by the end of allowed_lateness + poll_timeout: messages are "
                "written but not committed (is a replica down?); raise poll_timeout or look at the cluster"
            )
        time.sleep(INTERVAL_POLL)
