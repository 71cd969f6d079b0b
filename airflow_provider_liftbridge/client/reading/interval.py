"""Interval reads: the range one run reads is the run's time interval, not "what arrived since
the last run" (see ``docs/consume.md``, "Read by interval").

How Liftbridge timestamps messages (its ``server/partition.go`` and ``server/commitlog``): the
partition's leader stamps each message with its own wall clock (``time.Now().UnixNano()``) when
it takes the message in, before the message is written or replicated; a publisher cannot set it.
Followers copy the leader's timestamps. ``StartPosition.TIMESTAMP`` (the client's ``start_at`` with
an aware ``datetime``) asks the leader's time index for the earliest offset whose timestamp is at
or after the time (``commitLog.EarliestOffsetAfterTimestamp``: a binary search over the segments'
index entries, so it assumes timestamps that do not go backwards; the leader's clock stepping
back, or a new leader whose clock is behind, breaks that assumption). Where that lookup answers
"the next offset" although messages that late exist (a segment rolled by age), the search by
offset of :mod:`.seek` finds the offset instead.

So an interval ``[start, end)`` is read, per partition, as the offsets from the first message at
or after ``start`` up to (not including) the first committed message at or after ``end``. Two
adjacent intervals meet at the same offset (the same lookup), so every offset belongs to exactly
one interval, even where timestamps are out of order; with ordered timestamps (the usual case)
that is exactly "every message whose timestamp is in the interval".

**Complete.** A partition is complete for an interval when it holds a committed message at or
after the end (the newest committed message is that late), or when the time has passed
``end + lateness`` and nothing written is still uncommitted (newest offset = high watermark). The
time is the reading process's clock: Liftbridge has no call that reads a broker's clock, so
``lateness`` must also cover the skew between workers and brokers.

**Progress, retries and clears.** Per (position-cursor prefix, plan key, interval) one cursor on
the task's first partition counts the readings of the interval (``<prefix>|interval-run|<plan
key>|<start ms>-<end ms>``): ``2g`` while reading ``g`` is under way, ``2g + 1`` once a try
finished it (never set: reading 0 under way). Per partition, the reading's progress cursor holds
the last offset handed over and finished (``<prefix>|interval|<plan key>|<start ms>-<end ms>``,
plus ``|g<g>`` from the second reading on). A try that finds a reading under way goes on after its
progress cursors (a retry, or a clear of a run whose last try failed: batches handed over before
are not handed again). A try that finds the last reading finished (a clear, or a rerun, after a
success) starts reading ``g + 1``, with fresh progress cursors: it reads the whole interval again,
and the function gets those batches a second time, so it must be idempotent for them (the
archiver is: it rewrites the same file names). Every cursor only ever moves forward: Liftbridge's
FetchCursor can answer the largest value a cursor held when its cache misses (``server/cursors.go``,
see ``devserver.md``), so a cursor set back could read back as its old value. The cursors stream
is compacted by key, so each reading costs one small cursor per partition on the server, plus one
per interval, whatever the number of tries.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError, PartitionPausedError
from ..sync_client import LiftbridgeClient
from .plan import PartitionPlan, check_partitions, high_watermark
from .seek import first_offset_at

__all__ = [
    "DEFAULT_LATENESS",
    "Interval",
    "IntervalBounds",
    "IntervalPlanner",
    "NoTimestampsError",
    "clock_not_behind",
    "interval_cursor_ids",
    "latest_reading",
    "lateness_ns",
    "partition_complete",
]

#: How long after an interval's end a partition without a later message counts as complete.
DEFAULT_LATENESS = dt.timedelta(seconds=60)


class NoTimestampsError(InvalidArgumentError):
    """A partition's messages carry no usable timestamps (0 or negative): it cannot be read by
    interval. Raised before anything is read or committed."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A half-open time interval ``[start, end)``.

    :raises InvalidArgumentError: a naive datetime, or an end that is not after the start.
    """

    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        for name, value in (("start_time", self.start), ("end_time", self.end)):
            if not isinstance(value, dt.datetime) or value.tzinfo is None:
                raise InvalidArgumentError(f"{name} must be an aware datetime (with a time zone), got {value!r}")
        for name in ("start", "end"):  # plain UTC datetimes (Airflow hands pendulum ones, whose arithmetic differs)
            object.__setattr__(self, name, _plain_utc(getattr(self, name)))
        if self.end <= self.start:
            raise InvalidArgumentError(
                f"the interval's end {self.end.isoformat()} is not after its start {self.start.isoformat()}: "
                "give end_time after start_time (a run without a data interval, e.g. a manual run of an "
                "unscheduled DAG, needs explicit start_time and end_time)"
            )

    @property
    def start_ns(self) -> int:
        """The start in nanoseconds since the epoch (Liftbridge's timestamps)."""
        return _ns(self.start)

    @property
    def end_ns(self) -> int:
        """The end in nanoseconds since the epoch."""
        return _ns(self.end)

    @property
    def key(self) -> str:
        """``<start ms>-<end ms>``: names the interval in cursor ids."""
        return f"{self.start_ns // 1_000_000}-{self.end_ns // 1_000_000}"

    def to_dict(self) -> dict[str, str]:
        """JSON-safe (XCom): ISO 8601 start and end."""
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}

    @property
    def ms(self) -> tuple[int, int]:
        """``(start, end)`` in milliseconds since the epoch (the pipeline registry and run history)."""
        return self.start_ns // 1_000_000, self.end_ns // 1_000_000

    @classmethod
    def from_ms(cls, start: int, end: int) -> Interval:
        """The interval ``[start, end)`` given in milliseconds since the epoch (its :attr:`key` is
        that of the interval they were taken from).

        :raises InvalidArgumentError: an end that is not after the start.
        """
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return cls(epoch + dt.timedelta(milliseconds=start), epoch + dt.timedelta(milliseconds=end))


def _plain_utc(moment: dt.datetime) -> dt.datetime:
    utc = moment.astimezone(dt.UTC)
    return dt.datetime(utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=dt.UTC)


def _ns(moment: dt.datetime) -> int:
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def clock_not_behind(floor_ns: int) -> Callable[[], int]:
    """This process's clock (nanoseconds since the epoch), never behind ``floor_ns``: another
    process's clock when it decided something this one must not undo (a triggerer that found an
    interval's lateness passed: the resumed task must find it passed too, even on a host whose
    clock is a little behind)."""
    return lambda: max(time.time_ns(), floor_ns)


def lateness_ns(lateness: dt.timedelta) -> int:
    """A lateness in whole nanoseconds (exact: no float on the way)."""
    return (lateness.days * 86_400 + lateness.seconds) * 1_000_000_000 + lateness.microseconds * 1_000


def interval_cursor_ids(prefix: str, plan_key: str, interval: Interval, reading: int = 0) -> tuple[str, str]:
    """The cursor ids of an interval's progress in reading ``reading`` (per partition) and of the
    count of its readings (see the module docstring)."""
    tail = f"{plan_key}|{interval.key}"
    progress = f"{prefix}|interval|{tail}" + (f"|g{reading}" if reading else "")
    return progress, f"{prefix}|interval-run|{tail}"


def latest_reading(
    client: LiftbridgeClient, stream: str, prefix: str, plan_key: str, interval: Interval, mark_partition: int
) -> tuple[str, bool]:
    """The progress cursor id of the interval's latest reading, and whether that reading finished,
    from the count of readings kept on ``mark_partition`` (the task's first partition). Reads only.

    :raises CursorsDisabledError: the cluster has cursors off.
    """
    progress, readings = interval_cursor_ids(prefix, plan_key, interval)
    count = client.fetch_cursor(readings, stream, mark_partition)  # -1: never set (reading 0 under way)
    if count > 1:
        progress, _ = interval_cursor_ids(prefix, plan_key, interval, count // 2)
    return progress, count >= 0 and count % 2 == 1


def partition_complete(
    *,
    committed_timestamp: int | None,
    high_watermark: int,
    newest_offset: int | None,
    end_ns: int,
    lateness_ns: int,
    now_ns: int,
) -> str | None:
    """Whether one partition is complete for the interval ending at ``end_ns``: the one rule of the
    sync planner and the triggerer's wait (see the module docstring). Returns why (for the log),
    ``None`` if not.

    :param committed_timestamp: the timestamp of a committed message, the newest one known
        (``None``: none known, e.g. an empty partition).
    :param high_watermark: / :param newest_offset: the partition's offsets when looked at (-1: none;
        ``newest_offset`` ``None``: not known, so the lateness cannot decide).
    :param end_ns: the interval's end, nanoseconds since the epoch.
    :param lateness_ns: the allowed lateness, nanoseconds.
    :param now_ns: the clock of the process deciding (nanoseconds since the epoch).
    """
    if committed_timestamp is not None and committed_timestamp >= end_ns:
        return "a committed message at or after the end"
    if newest_offset is not None and now_ns >= end_ns + lateness_ns and newest_offset <= high_watermark:
        return "lateness passed, all committed" if high_watermark >= 0 else "empty partition, lateness passed"
    return None


@dataclass(frozen=True, slots=True)
class IntervalBounds:
    """Where an interval lies in one partition, as far as the partition knows now.

    :param partition: the partition.
    :param first: the first offset of the interval.
    :param end: the exclusive end (``first == end``: no message in the interval).
    :param high_watermark: the partition's high watermark when looked at.
    :param complete: whether the end is final (see the module docstring).
    :param why: how completeness was decided (for the log).
    """

    partition: int
    first: int
    end: int
    high_watermark: int
    complete: bool
    why: str


class IntervalPlanner:
    """Finds an interval's offsets per partition, says when they are complete, and plans the read
    (a :class:`~.plan.PartitionPlan` per partition, read with :func:`~.runner.read_plan` and
    committed to :attr:`progress_cursor`).

    :param client: the client.
    :param stream: the stream.
    :param cursor_prefix: the start of the progress cursors' ids (the user's ``cursor_id``).
    :param plan_key: the task (``dag_id/task_id[/map_index]``).
    :param interval: the interval to read.
    :param lateness: how long after the end a partition with no later message is complete.
    :param now_ns: the clock (nanoseconds since the epoch).
    :raises InvalidArgumentError: an empty name, a negative lateness.
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        *,
        cursor_prefix: str,
        plan_key: str,
        interval: Interval,
        lateness: dt.timedelta = DEFAULT_LATENESS,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        for name, value in (("stream", stream), ("cursor_prefix", cursor_prefix), ("plan_key", plan_key)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(lateness, dt.timedelta) or lateness < dt.timedelta(0):
            raise InvalidArgumentError(f"allowed_lateness must be a duration of 0 or more, got {lateness!r}")
        self.client = client
        self.stream = stream
        self.interval = interval
        self.lateness = lateness
        self._now_ns = now_ns
        self._ids = (cursor_prefix, plan_key)
        #: The start of the progress cursors' ids (recorded in the pipeline registry).
        self.cursor_prefix = cursor_prefix
        #: The progress cursor of the reading :meth:`plan` chose (before it: the first reading's).
        self.progress_cursor, self.readings_cursor = interval_cursor_ids(cursor_prefix, plan_key, interval)
        self.reading = 0

    @property
    def lateness_ns(self) -> int:
        """The allowed lateness in nanoseconds."""
        return lateness_ns(self.lateness)

    @property
    def complete_at_ns(self) -> int:
        """When every partition is complete at the latest (end + lateness), if all is committed."""
        return self.interval.end_ns + self.lateness_ns

    def check_partitions(self, partitions: Sequence[int] | None) -> list[int]:
        """:func:`~.plan.check_partitions` of this stream."""
        return check_partitions(self.client, self.stream, partitions)

    # -- looking ------------------------------------------------------------------------------
    def bounds(self, partition: int) -> IntervalBounds:
        """Where the interval lies in ``partition`` now, and whether that is final. A paused
        partition is resumed by the look (two bounded reads), as reading it would: an idle past
        hour is exactly what Liftbridge's auto-pause pauses.

        :raises NoTimestampsError: the partition's newest committed message has no timestamp.
        :raises NoSuchStreamError: / :raises NoSuchPartitionError: the partition is gone.
        """
        hw, newest = self._offsets(partition)
        interval = self.interval
        if hw < 0:
            why = self._complete(None, hw, newest)
            return IntervalBounds(partition, 0, 0, hw, why is not None, why or "waiting")
        last = self._newest_timestamp(partition, hw)
        # The newest timestamp lets each lookup check a "nothing that late" answer without a read.
        first = first_offset_at(
            self.client, self.stream, partition, interval.start, hw, resume=True, newest_timestamp=last
        )
        why = self._complete(last, hw, newest)
        if last >= interval.end_ns:
            end = first_offset_at(
                self.client, self.stream, partition, interval.end, hw, resume=True, newest_timestamp=last
            )
            return IntervalBounds(partition, min(first, end), end, hw, True, why or "")
        return IntervalBounds(partition, first, hw + 1, hw, why is not None, why or "waiting")

    def _complete(self, last: int | None, hw: int, newest: int) -> str | None:
        return partition_complete(
            committed_timestamp=last,
            high_watermark=hw,
            newest_offset=newest,
            end_ns=self.interval.end_ns,
            lateness_ns=self.lateness_ns,
            now_ns=self._now_ns(),
        )

    def incomplete(self, partitions: Sequence[int]) -> list[IntervalBounds]:
        """The partitions not complete yet (``[]``: the interval can be read)."""
        return [b for b in (self.bounds(p) for p in partitions) if not b.complete]

    def _offsets(self, partition: int) -> tuple[int, int]:
        """(high watermark, newest offset written); a paused partition's from the stream metadata."""
        try:
            info = self.client.fetch_partition_metadata(self.stream, partition)
        except PartitionPausedError:
            hw = high_watermark(self.client, self.stream, partition)
            return hw, hw  # nothing is written to a paused partition
        if info.high_watermark < 0 and info.newest_offset >= 0:  # a restarting cluster: wait it out
            return high_watermark(self.client, self.stream, partition), info.newest_offset
        return info.high_watermark, info.newest_offset

    def _newest_timestamp(self, partition: int, hw: int) -> int:
        """The timestamp of the newest committed message (one bounded read).

        :raises NoTimestampsError: it has none.
        """
        messages = self.client.subscribe(self.stream, partition=partition, start_at=hw, stop_at=hw, resume=True)
        try:
            message = next(messages, None)
        finally:
            messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription
        stamp = message.timestamp if message is not None else 0
        if stamp <= 0:
            raise NoTimestampsError(
                f"stream {self.stream!r} partition {partition}: the message at offset {hw} has no usable timestamp "
                f"({stamp}), so its messages cannot be read by interval; read this stream by position "
                "(read=SinceLastRun(...))"
            )
        return stamp

    # -- planning -----------------------------------------------------------------------------
    def plan(self, partitions: Sequence[int]) -> list[PartitionPlan]:
        """The plan of every partition: the interval's offsets, from after the progress cursor when
        an earlier try of this interval did not finish, else from the interval's first offset (see
        the module docstring). Nothing is read. When the last reading finished (a clear or a
        rerun), this starts the next one, with fresh progress cursors; no cursor is set back.

        :raises InvalidArgumentError: a partition is not complete (wait with :meth:`incomplete` first).
        :raises CursorsDisabledError: the cluster has cursors off.
        """
        if not partitions:
            return []
        bounds = [self.bounds(p) for p in partitions]
        waiting = [b.partition for b in bounds if not b.complete]
        if waiting:
            raise InvalidArgumentError(
                f"stream {self.stream!r}: partition(s) {waiting} are not complete for {self.interval.key}"
            )
        client, stream, mark_partition = self.client, self.stream, min(partitions)
        count = client.fetch_cursor(self.readings_cursor, stream, mark_partition)  # -1: never set
        self.reading = max(0, count) // 2
        if count >= 0 and count % 2 == 1:  # the last reading finished: a clear or a rerun reads it again
            self.reading += 1
            client.set_cursor(self.readings_cursor, stream, mark_partition, 2 * self.reading)
        self.progress_cursor, _ = interval_cursor_ids(*self._ids, self.interval, self.reading)
        plans = []
        for b in bounds:
            progress = client.fetch_cursor(self.progress_cursor, stream, b.partition)
            # A progress inside the interval is where an unfinished earlier try stopped (at its end:
            # that partition is done and the try died later, on another partition).
            resumed = b.first <= progress < b.end
            start = progress + 1 if resumed else b.first
            plans.append(PartitionPlan(stream, b.partition, start, b.end, b.high_watermark, resumed, start=b.first))
        return plans

    def finish(self, partitions: Sequence[int]) -> None:
        """Mark this reading of the interval finished (after a try handed over every batch)."""
        if partitions:
            self.client.set_cursor(self.readings_cursor, self.stream, min(partitions), 2 * self.reading + 1)
