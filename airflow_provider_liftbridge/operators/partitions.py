"""Partitioned runs (Airflow 3.2+, AIP-76) in the reading operators: a run's partition key, the
time it names and the time window it covers.

A ``CronPartitionTimetable`` run is a point in time with a partition key (``2026-03-10T09:00:00``
by default: the cron tick in the timetable's time zone, formatted with its ``key_format``). Its
window is from that time to the schedule's next time, which is what ``read=DataInterval()`` reads
on such a run and what ``{partition_date:...}`` of a ``path_layout`` names. See
``docs/consume.md``, "Partitioned runs".
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

from airflow.sdk import Context

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

from .archive_layout import RunPartition

__all__ = ["partition_key_of", "partition_of", "partition_window"]

#: Formats tried, in order, on a key when the timetable has no ``key_format`` of its own (a run of
#: ``PartitionedAssetTimetable``, a triggered run): those of Airflow's timetables and temporal mappers.
KEY_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H", "%Y-%m-%d", "%Y-%m")


def partition_key_of(context: Context) -> str | None:
    """The run's partition key (``None``: not a partitioned run). Airflow 3.3 puts it in the
    context; 3.2 only on the run."""
    key = context.get("partition_key") or getattr(context.get("dag_run"), "partition_key", None)
    return str(key) if key else None


def _timetable(context: Context) -> Any:
    return getattr(context.get("dag"), "timetable", None)


def _zone(timetable: Any) -> dt.tzinfo:
    """The timetable's time zone (UTC when it has none)."""
    zone = getattr(timetable, "timezone", None) or "UTC"
    if isinstance(zone, str):
        return dt.UTC if zone.upper() == "UTC" else ZoneInfo(zone)
    return zone if isinstance(zone, dt.tzinfo) else dt.UTC


def partition_of(context: Context) -> RunPartition | None:
    """The run's partition (``None``: not a partitioned run). Its time is the run's partition date
    where Airflow gives one (3.3), else the key read with the timetable's ``key_format`` (or, for
    timetables without one, the ISO-like formats of :data:`KEY_FORMATS`), in the timetable's time
    zone."""
    key = partition_key_of(context)
    if key is None:
        return None
    timetable = _timetable(context)
    zone = _zone(timetable)
    date = context.get("partition_date") or getattr(context.get("dag_run"), "partition_date", None)
    if isinstance(date, dt.datetime) and date.tzinfo is not None:
        # a plain datetime: pendulum's arithmetic drops a stdlib tzinfo
        return RunPartition(key, dt.datetime.fromtimestamp(date.timestamp(), zone))
    own = getattr(timetable, "key_format", None)
    for form in (own,) if isinstance(own, str) else KEY_FORMATS:
        try:
            moment = dt.datetime.strptime(key, form)
        except ValueError:
            continue
        return RunPartition(key, moment.replace(tzinfo=zone) if moment.tzinfo is None else moment.astimezone(zone))
    return RunPartition(key, None)


def _next_cron(expression: str, zone: dt.tzinfo, start: dt.datetime) -> dt.datetime | None:
    """The first time of the cron schedule after ``start``, in ``zone`` (as Airflow counts it: a
    schedule of every hour moves by real hours across a DST change, others by the wall clock)."""
    from croniter import CroniterBadCronError, CroniterBadDateError, croniter

    naive = start.astimezone(zone).replace(tzinfo=None)
    try:
        following = croniter(expression, start_time=naive).get_next(dt.datetime)
    except (CroniterBadCronError, CroniterBadDateError, ValueError):
        return None
    fields = expression.split()
    if len(fields) >= 2 and fields[1] == "*":
        return start + (following - naive)
    return following.replace(tzinfo=zone)


def partition_window(context: Context, partition: RunPartition) -> tuple[dt.datetime, dt.datetime]:
    """The time window of a partition: from its time to the next time of the DAG's schedule
    (a cron timetable's next tick, or a delta timetable's delta later).

    :raises LiftbridgeArgumentError: the key names no time, or the timetable has no next time;
        the message says what to give instead.
    """
    timetable = _timetable(context)
    if partition.time is None:
        own = getattr(timetable, "key_format", None)
        expected = repr(own) if isinstance(own, str) else " or ".join(repr(f) for f in KEY_FORMATS)
        raise LiftbridgeArgumentError(
            f"read=DataInterval() on a partitioned run: the partition key {partition.key!r} names no time (expected "
            f"{expected}), so it has no window to read; give DataInterval(start_time=..., end_time=...) (ISO 8601 "
            "with a time zone, or templates of the run), or read=SinceLastRun(...)"
        )
    start = partition.time
    end: dt.datetime | None = None
    expression = getattr(timetable, "expression", None)
    delta = getattr(timetable, "delta", None)
    if isinstance(expression, str):
        end = _next_cron(expression, _zone(timetable), start)
    elif isinstance(delta, dt.timedelta) or type(delta).__name__ == "relativedelta":
        end = start + delta
    if end is None or end <= start:
        raise LiftbridgeArgumentError(
            f"read=DataInterval() on a partitioned run: the timetable {type(timetable).__name__} of this DAG has no "
            f"next time after the partition {partition.key!r} ({start.isoformat()}), so the partition's window has "
            "no end; give DataInterval(end_time=...) (ISO 8601 with a time zone, or a template of the run), or "
            "schedule the DAG with CronPartitionTimetable"
        )
    return start, end
