"""Planned ranges: what one run of a reading task reads, fixed at the start of its first try and
kept on the server, so every retry of that run reads the same range (and nothing newer).

A *position cursor* (the user's ``cursor_id``, or a consumer group's ``__group:<group>``) holds,
per partition, the offset of the last message processed and committed. A *plan* holds, per
partition, the exclusive end of the range the current run reads: ``[position + 1, end)``.

Where a plan lives: three more cursors per (position cursor, plan key, partition), in the same
cursors stream as the position itself:

- ``<position cursor>|plan|<plan key>``: the plan's exclusive end (``-1``: no plan);
- ``<position cursor>|plan-start|<plan key>``: the plan's first offset (so a retry knows what
  earlier tries of the run covered, e.g. the archiver's files);
- ``<position cursor>|plan-run|<plan key>``: which run made the plan (:func:`run_tag` of its run id).

The plan key names the task, not the run (``dag_id/task_id[/map_index]``), so each task keeps
three cursors per partition however many runs it has: the cursors stream is compacted by key, so
what the plans take on the server is bounded by the number of tasks × partitions, never by the
number of runs. A try whose run tag matches resumes the plan; any other try (the first of a new
run, or a retry whose first try died before its plan was fully stored) plans afresh. The end is
and the start are stored before the tag, and nothing is read before every partition's plan is stored, so a plan
found with a matching tag is complete, and a plan made afresh by a retry replaces one nobody
read from.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import (
    InvalidArgumentError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    UnavailableError,
)
from ..sync_client import LiftbridgeClient
from ..types import StartPosition
from .seek import first_offset_at

__all__ = [
    "NO_PLAN",
    "PartitionPlan",
    "RangePlanner",
    "StartSpec",
    "check_partitions",
    "first_offset_at",
    "high_watermark",
    "plan_cursor_ids",
    "plan_start_cursor_id",
    "run_tag",
]

#: What a plan cursor holds when no plan was stored (FetchCursor's answer for a cursor never set).
NO_PLAN = -1

#: Where a partition starts when its position cursor was never set: ``EARLIEST`` (the oldest
#: message kept), ``LATEST`` / ``NEW_ONLY`` (after the newest message present at the first plan:
#: only what arrives later), an offset, or an aware ``datetime`` (the first message at or after it).
StartSpec = StartPosition | int | dt.datetime

_TAG_MASK = (1 << 63) - 1

log = logging.getLogger("airflow_provider_liftbridge.client.reading")


def run_tag(run_id: str) -> int:
    """A run id as a non-negative int64 (stored in a cursor): 63 bits of its BLAKE2b hash."""
    digest = hashlib.blake2b(run_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _TAG_MASK


def plan_cursor_ids(position_cursor: str, plan_key: str) -> tuple[str, str]:
    """The cursor ids holding a plan's exclusive end and its run tag (see the module docstring)."""
    return f"{position_cursor}|plan|{plan_key}", f"{position_cursor}|plan-run|{plan_key}"


def plan_start_cursor_id(position_cursor: str, plan_key: str) -> str:
    """The cursor id holding a plan's first offset (see the module docstring)."""
    return f"{position_cursor}|plan-start|{plan_key}"


#: How long a plan waits for a partition's leader to commit what it holds (a restarted leader,
#: a newly elected one, a restarting cluster).
HW_SETTLE_WAIT = 30.0


def high_watermark(
    client: LiftbridgeClient, stream: str, partition: int, *, settle_wait: float = HW_SETTLE_WAIT
) -> int:
    """The partition's high watermark, once its leader has committed every message it held when
    first asked; for a paused partition (whose leader does not answer for it) the one in the
    cluster's metadata, without resuming it.

    A leader's high watermark can read below messages that were committed before it was asked
    (``docs/reading-positions.md``): a broker restarted from its high-watermark checkpoint (written
    every 5 s) reads that checkpoint until its followers fetch again (measured on Liftbridge v1.9:
    255 of 2,999 for about 7 s); a newly elected leader knows the high watermark one fetch late;
    right after a full-cluster restart it reads -1 for about 9 s. Taken at its word, a plan would
    stop short of what was committed before the run. So while the high watermark is below the
    newest offset first seen, it is asked again, with backoff, for up to ``settle_wait`` seconds;
    new messages arriving meanwhile do not hold it up. A partition that still has not committed by
    then (an in-sync replica missing, so nothing commits) is read up to its high watermark, with a
    warning: the next run reads the rest.

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
    :raises UnavailableError: the high watermark stayed unknown (-1) for ``settle_wait`` seconds
        while the leader's log holds messages.
    """
    try:
        deadline = time.monotonic() + settle_wait
        pause = 0.05
        held = None
        while True:
            part = client.fetch_partition_metadata(stream, partition)
            held = part.newest_offset if held is None else held
            if part.high_watermark >= held:
                return part.high_watermark
            if time.monotonic() + pause > deadline:
                if part.high_watermark >= 0:
                    log.warning(
                        "stream %r partition %d: the leader has committed up to offset %d of the %d it held "
                        "%g s ago; this run reads up to %d, the next one the rest",
                        stream,
                        partition,
                        part.high_watermark,
                        held,
                        settle_wait,
                        part.high_watermark,
                    )
                    return part.high_watermark
                raise UnavailableError(
                    f"stream {stream!r} partition {partition}: the high watermark is still unknown (-1) "
                    f"{settle_wait:g} s on, while the leader's log ends at offset {part.newest_offset} (a cluster "
                    "restarting reads -1 until its partitions commit again); try again once the cluster is back"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
    except PartitionPausedError:
        info = client.fetch_metadata([stream]).streams.get(stream)
        listed = info.partitions.get(partition) if info is not None else None
        if listed is None:
            raise
        return listed.high_watermark


def check_partitions(client: LiftbridgeClient, stream: str, partitions: Sequence[int] | None) -> list[int]:
    """The partitions to read: ``partitions`` (checked against the stream) or all of them.

    :raises NoSuchStreamError: the stream does not exist.
    :raises NoSuchPartitionError: a listed partition does not exist (the message lists the ones that do).
    """
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist: create it first, or fix the stream name")
    known = sorted(info.partitions)
    if partitions is None:
        return known
    missing = sorted(set(partitions) - set(known))
    if missing:
        raise NoSuchPartitionError(
            f"stream {stream!r} has no partition {', '.join(map(str, missing))} (it has partitions "
            f"{known[0]}..{known[-1]}): fix partitions"
        )
    return sorted(set(partitions))


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """What one partition's plan leaves to read in this try.

    :param stream: the stream.
    :param partition: the partition.
    :param next_offset: the first offset to read now: the position cursor + 1.
    :param end: the plan's exclusive end (offsets ``next_offset .. end - 1`` are left).
    :param high_watermark: the partition's high watermark when this try looked.
    :param resumed: the plan was made by an earlier try of the same run.
    :param start: the plan's first offset (``next_offset`` of the run's first try; ``-1`` for a
        plan stored before plans kept their start).
    """

    stream: str
    partition: int
    next_offset: int
    end: int
    high_watermark: int
    resumed: bool
    start: int = -1

    @property
    def remaining(self) -> int:
        """How many offsets are left to read (0 when the plan is done)."""
        return max(0, self.end - self.next_offset)

    @property
    def last_offset(self) -> int:
        """The plan's last offset (``end - 1``)."""
        return self.end - 1


class RangePlanner:
    """Makes, stores and finds the plans of one reading task (see the module docstring).

    :param client: the client (only its public calls are used).
    :param stream: the stream read.
    :param position_cursor: the cursor id holding the committed positions.
    :param plan_key: names the task the plan belongs to, e.g. ``dag_id/task_id[/map_index]``.
    :param run_id: the run this try belongs to (retries of one run share it).
    :param start_at: where a partition starts when its position cursor was never set.
    :param max_messages: at most this many offsets per partition in one plan (``None``: all).
    :raises InvalidArgumentError: an empty name, a ``max_messages`` below 1, a naive datetime.
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        *,
        position_cursor: str,
        plan_key: str,
        run_id: str,
        start_at: StartSpec = StartPosition.EARLIEST,
        max_messages: int | None = None,
    ) -> None:
        for name, value in (("stream", stream), ("position_cursor", position_cursor), ("plan_key", plan_key)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(run_id, str) or not run_id:
            raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
        if max_messages is not None and (isinstance(max_messages, bool) or max_messages < 1):
            raise InvalidArgumentError(f"max_messages must be at least 1 (or None for no cap), got {max_messages!r}")
        if isinstance(start_at, dt.datetime) and start_at.tzinfo is None:
            raise InvalidArgumentError(f"start_at {start_at!r} is a naive datetime; give one with a time zone")
        if isinstance(start_at, int) and start_at < 0:
            raise InvalidArgumentError(f"start_at offset must not be negative, got {start_at}")
        self.client = client
        self.stream = stream
        self.position_cursor = position_cursor
        self.plan_key = plan_key
        self.tag = run_tag(run_id)
        self.start_at = start_at
        self.max_messages = max_messages
        self.end_cursor, self.tag_cursor = plan_cursor_ids(position_cursor, plan_key)
        self.start_cursor = plan_start_cursor_id(position_cursor, plan_key)

    # -- looking ------------------------------------------------------------------------------
    def check_partitions(self, partitions: Sequence[int] | None) -> list[int]:
        """:func:`check_partitions` of this planner's stream."""
        return check_partitions(self.client, self.stream, partitions)

    def high_watermark(self, partition: int) -> int:
        """:func:`high_watermark` of this stream's ``partition``."""
        return high_watermark(self.client, self.stream, partition)

    def pending(self, partitions: Iterable[int]) -> dict[int, int]:
        """Per partition, how many committed messages lie after the position (nothing is stored).

        A partition without a position counts from where ``start_at`` would start it.

        :raises CursorsDisabledError: the cluster has cursors off (the message names the setting).
        """
        out = {}
        for partition in partitions:
            hw = self.high_watermark(partition)
            position = self.client.fetch_cursor(self.position_cursor, self.stream, partition)
            start = position + 1 if position >= 0 else self._start_offset(partition, hw)
            out[partition] = max(0, hw + 1 - start)
        return out

    def has_plan(self, partitions: Iterable[int]) -> bool:
        """Whether this run stored a plan for any of ``partitions`` (an earlier try made it)."""
        return any(
            self.client.fetch_cursor(self.tag_cursor, self.stream, p) == self.tag
            and self.client.fetch_cursor(self.end_cursor, self.stream, p) != NO_PLAN
            for p in partitions
        )

    # -- planning -----------------------------------------------------------------------------
    def plan(self, partitions: Sequence[int]) -> list[PartitionPlan]:
        """This try's plan of every partition: the run's stored plan where there is one, else a
        new plan ``[position + 1, min(high watermark + 1, position + 1 + max_messages))``, stored
        before this returns (all partitions' plans are stored before any is returned).

        :raises CursorsDisabledError: the cluster has cursors off (the message names the setting).
        :raises NoSuchStreamError: / :raises NoSuchPartitionError: the stream or a partition is gone.
        """
        return [self._plan_partition(p) for p in partitions]

    def _plan_partition(self, partition: int) -> PartitionPlan:
        client, stream = self.client, self.stream
        position = client.fetch_cursor(self.position_cursor, stream, partition)  # CursorsDisabledError first
        hw = self.high_watermark(partition)
        end = client.fetch_cursor(self.end_cursor, stream, partition)
        if end != NO_PLAN and client.fetch_cursor(self.tag_cursor, stream, partition) == self.tag:
            start = client.fetch_cursor(self.start_cursor, stream, partition)
            return PartitionPlan(stream, partition, position + 1, end, hw, resumed=True, start=start)
        if position < 0 and end != NO_PLAN:
            # An earlier run planned without a position: it started at offset 0 (any later start
            # is stored as a position below), e.g. "latest" on a partition that was empty then.
            start = 0
        elif position < 0:
            start = self._start_offset(partition, hw)
            if start > 0:  # where the first run starts is a position: later runs go on from it
                client.set_cursor(self.position_cursor, stream, partition, start - 1)
        else:
            start = position + 1
        end = max(start, hw + 1)
        if self.max_messages is not None:
            end = min(end, start + self.max_messages)
        client.set_cursor(self.end_cursor, stream, partition, end)  # end and start before the tag: see the docstring
        client.set_cursor(self.start_cursor, stream, partition, start)
        client.set_cursor(self.tag_cursor, stream, partition, self.tag)
        return PartitionPlan(stream, partition, start, end, hw, resumed=False, start=start)

    def _start_offset(self, partition: int, hw: int) -> int:
        """Where a partition without a position starts."""
        start = self.start_at
        if isinstance(start, StartPosition):
            return 0 if start is StartPosition.EARLIEST else hw + 1
        if isinstance(start, int):
            return start
        if hw < 0:
            return 0
        return first_offset_at(self.client, self.stream, partition, start, hw)
