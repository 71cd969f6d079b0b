"""Reading strategies: one class per reading mode, each doing everything its mode decides in one
try of a reading task: which partitions, what to wait for before planning, the plan (made or
resumed), where positions are committed, what marks the read complete, what the pipeline registry
and the run history get, and the mode's part of the task's result.

- :class:`SinceLastRunReading`: what arrived since the last run, positions in the task's cursor.
- :class:`ConsumerGroupReading`: the same from a consumer group's positions, on the partitions the
  group assigns (a member joins for the try and leaves after it).
- :class:`DataIntervalReading`: every message of a time interval (the run's, or a given one),
  with per-interval progress cursors (:mod:`.interval`).

A reading operator builds :class:`TaskRun` from its framework's context and calls the strategy;
the batched read in between is :func:`~.runner.read_plan`, shared by all. A strategy's
:meth:`~ReadingStrategy.wait` says what to wait for as a :class:`Wait`, which the caller either
polls in its own process (:meth:`Wait.poll`) or hands to a trigger (:attr:`Wait.trigger`).

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..consumer import group_cursor_id
from ..errors import InvalidArgumentError
from ..sync_client import LiftbridgeClient
from .history import PartitionRun, RunEntry, record_run
from .interval import Interval, IntervalPlanner, clock_not_behind
from .plan import PartitionPlan, RangePlanner, StartSpec
from .registry import PipelineEntry, record_pipeline
from .runner import PartitionReport
from .waits import IntervalWait, MessagesWait, Wait

__all__ = [
    "ConsumerGroupReading",
    "DataIntervalReading",
    "ReadingStrategy",
    "SinceLastRunReading",
    "TaskRun",
]

_log = logging.getLogger("airflow_provider_liftbridge.client.reading")


@dataclass(frozen=True, slots=True)
class TaskRun:
    """The try of a reading task, as a strategy needs it (the operator fills it in from its context).

    :param dag_id: / :param task_id: / :param map_index: the task (``-1``: not mapped).
    :param run_id: the run (retries of one run share it).
    :param operator: the operator's class name (for the pipeline registry).
    :param dead_letter_stream: where the task sends what it cannot process (``None``: nowhere).
    :param window: the run's time window: its data interval, or a partitioned run's partition
        window (``None``: the run has none); what a :class:`DataIntervalReading` reads by default.
    :param clock_floor_ns: the triggerer's clock when an interval trigger fired for this try
        (``None``: it did not); the try's clock never runs behind it.
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    operator: str = ""
    dead_letter_stream: str | None = None
    window: tuple[dt.datetime | None, dt.datetime | None] | None = None
    clock_floor_ns: int | None = None

    @property
    def plan_key(self) -> str:
        """``dag_id/task_id[/map_index]``: names the task's plans and progress cursors."""
        key = f"{self.dag_id}/{self.task_id}"
        return key + f"/{self.map_index}" if self.map_index >= 0 else key


class ReadingStrategy(ABC):
    """One reading mode's decisions for one try (see the module docstring). Used as a context
    manager: :meth:`open` chooses the partitions (joining a group, for a group), the block reads,
    the end releases what the try holds.

    :param client: the client.
    :param stream: the stream read.
    :param run: the try.
    :param log: where it says what it does (default: this module's logger; a task gives its own).
    """

    def __init__(
        self, client: LiftbridgeClient, stream: str, run: TaskRun, *, log: logging.Logger | None = None
    ) -> None:
        self.client = client
        self.stream = stream
        self.run = run
        self.log = log or _log
        self.partitions: list[int] = []
        self._exit = ExitStack()

    # -- the try's lifetime -----------------------------------------------------------------------
    def __enter__(self) -> ReadingStrategy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    @abstractmethod
    def open(self, partitions: Sequence[int] | None) -> list[int]:
        """Choose and check the partitions of this try (``partitions``: the given ones, ``None``:
        all) and remember them; nothing is planned yet.

        :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
        """

    # -- before planning --------------------------------------------------------------------------
    @abstractmethod
    def wait(self) -> Wait | None:
        """What to wait for before planning (``None``: nothing)."""

    # -- planning and reading ---------------------------------------------------------------------
    @abstractmethod
    def plan(self) -> list[PartitionPlan]:
        """This try's plans: the run's stored ones (a retry resumes them) or new ones, stored
        before this returns."""

    #: The cursor id the read commits positions to (set once it is known).
    position_cursor: str = ""

    #: Asked before each batch: whether the partition is still this try's (``None``: always).
    keep_reading: Callable[[PartitionPlan], bool] | None = None
    #: Called before each commit, raising once the try may no longer commit (``None``: no check).
    confirm_owner: Callable[[], None] | None = None

    # -- after reading ----------------------------------------------------------------------------
    def finish(self, plans: Sequence[PartitionPlan]) -> None:
        """Mark the read complete, after every batch of ``plans`` was handed over (default: the
        positions say it already)."""
        return None  # by position, the positions say it

    def pipeline_entry(self, plans: Sequence[PartitionPlan]) -> PipelineEntry:
        """This task in the pipeline registry (the UI view finds it so)."""
        run = self.run
        return PipelineEntry(
            stream=self.stream,
            position_cursor=self.registry_cursor,
            plan_key=run.plan_key,
            dag_id=run.dag_id,
            task_id=run.task_id,
            map_index=run.map_index,
            run_id=run.run_id,
            partitions=tuple(plan.partition for plan in plans),
            operator=run.operator,
            dead_letter_stream=run.dead_letter_stream,
            **self._entry_fields(plans),
        )

    @property
    def registry_cursor(self) -> str:
        """The cursor id the registry entry names (default: the position cursor)."""
        return self.position_cursor

    def _entry_fields(self, plans: Sequence[PartitionPlan]) -> dict[str, Any]:
        return {}

    def register(self, plans: Sequence[PartitionPlan]) -> None:
        """Record :meth:`pipeline_entry` in the registry, once per plan made (a resumed plan was
        recorded by the try that made it).

        :raises LiftbridgeError: the registry could not be written (reading does not depend on it).
        """
        if not all(plan.resumed for plan in plans):
            record_pipeline(self.client, self.pipeline_entry(plans))

    def record(self, reports: dict[int, PartitionReport]) -> None:
        """Append this try to the run history (for the view's charts).

        :raises LiftbridgeError: the history could not be written (reading does not depend on it).
        """
        run = self.run
        record_run(
            self.client,
            RunEntry(
                dag_id=run.dag_id,
                task_id=run.task_id,
                map_index=run.map_index,
                run_id=run.run_id,
                stream=self.stream,
                partitions={
                    p: PartitionRun(
                        processed=r.processed,
                        dead_lettered=r.dead_lettered,
                        lag=r.lag,
                        # What the try saw last: its position plus the messages after it.
                        high_watermark=(r.last_offset if r.last_offset is not None else r.committed) + r.lag,
                    )
                    for p, r in reports.items()
                },
                interval=self._interval_ms(),
            ),
        )

    def _interval_ms(self) -> tuple[int, int] | None:
        return None

    @abstractmethod
    def result(self, plans: Sequence[PartitionPlan], reports: dict[int, PartitionReport]) -> dict[str, Any]:
        """The mode's part of the task's result (where positions live; the interval read); it may
        add to the partitions' reports."""


# -- by position: since the last run, or a consumer group's -------------------------------------------


class SinceLastRunReading(ReadingStrategy):
    """What arrived since the last run (position cursor + 1 up to the high watermark when the
    run's first try planned, at most ``max_messages`` per partition), the plan kept on the server
    so every try of the run reads the same range (:mod:`.plan`).

    :param cursor_id: the cursor holding the positions.
    :param start_at: where a partition without a position starts.
    :param max_messages: at most this many messages per partition in one run (``None``: all).
    :param min_messages: wait for at least this many messages over the partitions before planning.
    :param poll_timeout: seconds that wait may take.
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        run: TaskRun,
        *,
        cursor_id: str,
        start_at: StartSpec,
        max_messages: int | None = None,
        min_messages: int | None = None,
        poll_timeout: float = 60.0,
        log: logging.Logger | None = None,
    ) -> None:
        super().__init__(client, stream, run, log=log)
        self.position_cursor = cursor_id
        self.min_messages = min_messages
        self.poll_timeout = poll_timeout
        self.planner = RangePlanner(
            client,
            stream,
            position_cursor=cursor_id,
            plan_key=run.plan_key,
            run_id=run.run_id,
            start_at=start_at,
            max_messages=max_messages,
        )

    def open(self, partitions: Sequence[int] | None) -> list[int]:
        self.partitions = self.planner.check_partitions(partitions)
        return self.partitions

    def wait(self) -> Wait | None:
        """``min_messages`` there to read, unless unset or this run planned already (a retry goes
        on with its plan without waiting)."""
        if not self.min_messages or not self.partitions:
            return None
        if self.planner.has_plan(self.partitions):
            self.log.info("This run planned already (an earlier try): reading the rest of its plan without waiting")
            return None
        return MessagesWait(self.planner, self.partitions, self.min_messages, self.poll_timeout, self.log)

    def plan(self) -> list[PartitionPlan]:
        return self.planner.plan(self.partitions)

    def _entry_fields(self, plans: Sequence[PartitionPlan]) -> dict[str, Any]:
        return {"cursor_id": self.position_cursor, "mode": "SinceLastRun"}

    def result(self, plans: Sequence[PartitionPlan], reports: dict[int, PartitionReport]) -> dict[str, Any]:
        return {"cursor_id": self.position_cursor}


class ConsumerGroupReading(SinceLastRunReading):
    """As :class:`SinceLastRunReading`, from a consumer group's positions, on the partitions the
    group assigns to this try's member. The member reads only after the hand-over of the
    partitions it took (their previous owner has stopped and committed before the plan reads the
    group's positions); before each batch it checks a partition is still its own, and before each
    commit that it is still in the group: its keeper heartbeats while the try works, up to
    ``max_poll_interval`` per batch, and a batch back later commits nothing
    (:class:`~airflow_provider_liftbridge.client.MaxPollIntervalExceededError`). The member leaves
    when the try ends.

    :param group_id: the consumer group.
    :param max_poll_interval: seconds one batch may take before the member leaves (``None``: never).
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        run: TaskRun,
        *,
        group_id: str,
        max_poll_interval: float | None,
        **position: Any,
    ) -> None:
        super().__init__(client, stream, run, cursor_id=group_cursor_id(group_id), **position)
        self.group_id = group_id
        self.max_poll_interval = max_poll_interval

    def open(self, partitions: Sequence[int] | None) -> list[int]:
        """Join the group; the partitions it assigns (after their hand-over wait)."""
        member = self._exit.enter_context(
            self.client.group_consumer(
                self.group_id, [self.stream], auto_commit_interval=None, max_poll_interval=self.max_poll_interval
            )
        )
        wait = member.handover_wait
        if wait > 0:
            self.log.info("Waiting %.1f s for the partitions' previous owners to hand them over", wait)
            time.sleep(wait)
        self.keep_reading = lambda plan: plan.partition in member.check_assignments().get(self.stream, [])
        self.confirm_owner = member.confirm_membership
        assigned = member.check_assignments().get(self.stream, [])
        self.log.info(
            "Consumer group %r assigned partition(s) %s of stream %r to member %s",
            self.group_id,
            assigned,
            self.stream,
            member.consumer_id,
        )
        self.partitions = self.planner.check_partitions(assigned)
        return self.partitions

    def _entry_fields(self, plans: Sequence[PartitionPlan]) -> dict[str, Any]:
        return {"group_id": self.group_id, "mode": "ConsumerGroup"}

    def result(self, plans: Sequence[PartitionPlan], reports: dict[int, PartitionReport]) -> dict[str, Any]:
        return {"group_id": self.group_id}


# -- by interval --------------------------------------------------------------------------------------


class DataIntervalReading(ReadingStrategy):
    """Every message whose timestamp is in an interval (``[start, end)``, from the run's window
    where not given), once every partition is complete for it; the same messages in every try,
    clear and backfill (:mod:`.interval`). Positions are the interval's progress cursors.

    :param interval: the interval (``None``: the run's window).
    :param cursor_id: the prefix of the progress cursors (default ``"airflow"``).
    :param lateness: how long after the end a partition with no later message is complete.
    :param poll_timeout: seconds past ``end + lateness`` the in-process wait may take.
    :raises InvalidArgumentError: no interval (none given, the run has no window), or an end not
        after the start.
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        run: TaskRun,
        *,
        start: dt.datetime | None,
        end: dt.datetime | None,
        cursor_id: str | None,
        lateness: dt.timedelta,
        poll_timeout: float = 60.0,
        log: logging.Logger | None = None,
    ) -> None:
        super().__init__(client, stream, run, log=log)
        window = run.window or (None, None)
        start, end = start or window[0], end or window[1]
        if start is None or end is None:
            raise InvalidArgumentError(
                "read=DataInterval() needs an interval: this run has no data interval (an unscheduled DAG, or an "
                "asset-triggered run) and no partition key; give DataInterval(start_time=..., end_time=...)"
            )
        floor = run.clock_floor_ns or 0
        self.cursor_id = cursor_id
        self.interval = Interval(start, end)
        self.poll_timeout = poll_timeout
        self.planner = IntervalPlanner(
            client,
            stream,
            cursor_prefix=cursor_id or "airflow",
            plan_key=run.plan_key,
            interval=self.interval,
            lateness=lateness,
            # The triggerer found the lateness passed: the resumed try must too (else it defers again).
            now_ns=clock_not_behind(floor),
        )

    def open(self, partitions: Sequence[int] | None) -> list[int]:
        self.partitions = self.planner.check_partitions(partitions)
        self.log.info(
            "Reading stream %r partitions %s by interval [%s, %s) (lateness %s)",
            self.stream,
            self.partitions,
            self.interval.start.isoformat(),
            self.interval.end.isoformat(),
            self.planner.lateness,
        )
        return self.partitions

    def wait(self) -> Wait | None:
        return IntervalWait(self.planner, self.partitions, self.poll_timeout, self.log)

    def plan(self) -> list[PartitionPlan]:
        plans = self.planner.plan(self.partitions)
        self.position_cursor = self.planner.progress_cursor
        return plans

    def finish(self, plans: Sequence[PartitionPlan]) -> None:
        self.planner.finish([plan.partition for plan in plans])

    def _entry_fields(self, plans: Sequence[PartitionPlan]) -> dict[str, Any]:
        start, end = self.interval.ms
        return {
            "cursor_id": self.cursor_id or None,
            "mode": "DataInterval",
            "interval_start": start,
            "interval_end": end,
            "interval_offsets": tuple((plan.partition, plan.start, plan.end) for plan in plans),
        }

    @property
    def registry_cursor(self) -> str:
        """The prefix of the progress cursors (the registry entry of an interval read names it)."""
        return self.planner.cursor_prefix

    def _interval_ms(self) -> tuple[int, int] | None:
        return self.interval.ms

    def result(self, plans: Sequence[PartitionPlan], reports: dict[int, PartitionReport]) -> dict[str, Any]:
        """The progress cursors' prefix, the interval read, each partition's first offset of it
        (in its report), and ``empty`` when it holds no message."""
        out: dict[str, Any] = {"cursor_id": self.cursor_id, "interval": self.interval.to_dict()}
        for plan in plans:
            reports[plan.partition].extra["interval_first_offset"] = plan.start
        if not any(plan.end > plan.start for plan in plans):
            self.log.info(
                "The interval [%s, %s) holds no messages on stream %r partitions %s: nothing to read",
                self.interval.start.isoformat(),
                self.interval.end.isoformat(),
                self.stream,
                [p.partition for p in plans],
            )
            out["empty"] = True
        return out
