"""``LiftbridgeReadingOperator``: the base of the operators that read a stream in planned ranges
(:class:`~.consume.LiftbridgeConsumeOperator`, the stream-to-file archiver).

It holds what they share: which partitions (given, all, or a consumer group's), where to resume
(a cursor, or the group's positions), the wait for ``min_messages`` (in the worker or the
triggerer, :mod:`.min_messages`), the plan (:class:`~airflow_provider_liftbridge.client.reading.RangePlanner`), the
batched read with its commits (:func:`~airflow_provider_liftbridge.client.reading.read_plan`),
the XCom and the lineage. A subclass says what a batch is for: :meth:`make_handler`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk import Context, conf

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    LiftbridgeError,
    StartPosition,
)
from airflow_provider_liftbridge.client.consumer import MAX_POLL_INTERVAL, MaxPollIntervalExceededError, group_cursor_id
from airflow_provider_liftbridge.client.reading import (
    COMMIT_CADENCES,
    DEFAULT_LATENESS,
    BatchFailed,
    BatchHandler,
    DeadLetters,
    Interval,
    IntervalPlanner,
    PartitionPlan,
    PartitionReport,
    PartitionRun,
    PipelineEntry,
    RangePlanner,
    RunEntry,
    StartSpec,
    check_cadence,
    read_plan,
    record_pipeline,
    record_run,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_bool,
    check_choice,
    check_name,
    check_non_negative_int,
    check_partition_list,
    check_positive_int,
    check_timeout,
    optional,
    parse_start_at,
    waits_for_rendering,
)

from .base import LiftbridgeBaseOperator
from .dead_letters import DeadLetterStream, check_dead_letters, dead_letters_from_keywords
from .group_member import ConfirmOwner, KeepReading, group_partitions
from .interval_reading import READ_BY, check_lateness, check_read_by_arguments, parse_time, wait_for_interval
from .links import LiftbridgePipelineLink, LiftbridgeStreamLink
from .metrics import emit_reading_stats
from .min_messages import DEFAULT_POLL_TIMEOUT, wait_for_min_messages

__all__ = ["LiftbridgeReadingOperator", "parse_partitions", "parse_reading_start", "plan_key_of"]


def parse_partitions(value: Any, name: str = "partitions") -> list[int] | None:
    """``partitions`` as given or rendered: ``None``/``""`` (all), an int, a list of ints, or
    their text (``"1"``, ``"0,2"``, ``"[0, 2]"``, what a template renders), sorted, once each.

    :raises LiftbridgeArgumentError: anything else, or a negative number.
    """
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            raise bad_argument(name, value, "a list of partition numbers", f"e.g. {name}=[0, 1] or '0,1'") from None
    elif isinstance(value, str) and "," in value:
        value = [p.strip() for p in value.split(",") if p.strip()]
    partitions = check_partition_list(value, name)
    if partitions is not None and not partitions:
        raise bad_argument(name, value, "at least one partition number", f"e.g. {name}=[0], or None for all")
    return None if partitions is None else sorted(set(partitions))


def parse_reading_start(value: Any, name: str = "start_at") -> StartSpec:
    """``start_at``: ``"earliest"``, ``"latest"`` (``"new_only"`` means the same here), an offset,
    an aware ``datetime``, an ISO 8601 timestamp, or epoch milliseconds as ``"<digits>ms"``.

    :raises LiftbridgeArgumentError: none of those.
    """
    if isinstance(value, str) and value.strip().endswith("ms") and value.strip()[:-2].isdigit():
        return dt.datetime.fromtimestamp(int(value.strip()[:-2]) / 1000, dt.UTC)
    start = parse_start_at(value, name)
    return StartPosition.LATEST if start is StartPosition.NEW_ONLY else start


def plan_key_of(context: Context) -> tuple[str, str]:
    """``(plan key, run id)`` of the running task: ``dag_id/task_id[/map_index]`` and the run id.

    :raises LiftbridgeArgumentError: no task instance in the context (the operator runs outside a DAG run).
    """
    ti = context.get("ti")
    run_id = context.get("run_id")
    if ti is None or not run_id:
        raise LiftbridgeArgumentError(
            "a reading operator plans per DAG run and needs the task instance: run it in a DAG (dag.test() works)"
        )
    key = f"{ti.dag_id}/{ti.task_id}"
    map_index = getattr(ti, "map_index", None)
    if map_index is not None and map_index >= 0:
        key += f"/{map_index}"
    return key, str(run_id)


class LiftbridgeReadingOperator(LiftbridgeLineageMixin, LiftbridgeBaseOperator):
    """Read what arrived on a stream since the last run, in a range planned once per DAG run.

    At its start a try plans, per partition, the range from the committed position + 1 to the
    high watermark (at most ``max_messages``), unless an earlier try of the same run already did:
    then it goes on with that plan from the committed position, so a retry never reads what
    arrived after the plan. Batches of up to ``max_batch_size`` go to :meth:`make_handler`'s
    handler; positions move as ``commit_cadence`` says. See ``docs/consume.md``.

    :param stream: the stream to read. (templated)
    :param partitions: the partitions to read (default: all); a list, one number, or their text,
        so ``.expand(partitions=[[0], [1]])`` maps one task per partition. (templated)
    :param cursor_id: the cursor holding the positions (needs cursors on the cluster). (templated)
    :param group_id: instead of ``cursor_id``: join this consumer group and read the partitions
        it assigns, from the group's positions. (templated)
    :param start_at: where a partition starts the first time (no position yet): ``"earliest"``
        (default), ``"latest"`` (only what arrives after the first plan), an offset, a timestamp
        (aware ``datetime``, ISO 8601 text, or ``"<epoch ms>ms"``). (templated)
    :param max_messages: at most this many messages per partition in one run (default: all).
    :param max_batch_size: messages per batch (default 1000).
    :param commit_cadence: ``"end_of_batch"`` (default), ``"end_of_operator"`` or ``"never"``.
    :param min_messages: wait until at least this many messages are there to read (over the
        task's partitions) before planning; ``deferrable=True`` waits in the triggerer.
    :param poll_timeout: seconds to wait for ``min_messages`` before the try fails (default 60).
    :param deferrable: wait for ``min_messages`` in the triggerer (default: ``[operators] default_deferrable``).
    :param read_by: ``"position"`` (default): what arrived since the last run, as above;
        ``"interval"``: every message whose timestamp is in the run's data interval (on a
        partitioned run, its partition's window; or ``[start_time, end_time)``), found by
        Liftbridge's time index, the same in every try, clear and backfill. ``cursor_id`` then
        only names the progress cursors (optional), ``group_id``, ``start_at``, ``max_messages``
        and ``min_messages`` do not apply. The task waits until every partition is complete for
        the interval. See ``docs/consume.md``.
    :param start_time: / :param end_time: with ``read_by="interval"``: the interval to read
        instead of the data interval (aware datetimes or ISO 8601 text). (templated)
    :param allowed_lateness: with ``read_by="interval"``: how long after the end a partition that
        has no later message counts as complete (``timedelta`` or seconds; default 60 s).
    :param max_poll_interval: with ``group_id``: seconds one batch (reading it and the handler) may
        take before the task's member leaves the group (default 300; ``None``: never). Until then
        the member heartbeats on its own, so a batch slower than the group's consumer timeout
        keeps its partitions (``docs/consumer-groups.md``, "What keeps a member alive").
    :param dead_letters: where a message that cannot be processed goes, a
        :class:`~.dead_letters.DeadLetterStream` (its ``stream`` and whether to ``create`` it):
        published there with why in its headers, acknowledged before the position moves past it,
        and the read goes on. ``None`` (default): such a message fails the task, the position
        stays before it. (templated: its ``stream``)
    :param on_error: / :param dead_letter_stream: / :param create_dead_letter_stream: deprecated,
        the three keywords ``dead_letters`` replaces (``on_error="dead_letter"`` with a stream is
        ``DeadLetterStream(stream, create=...)``); they still work, with an
        ``AirflowProviderDeprecationWarning``.
    :param liftbridge_conn_id: the connection to use. (templated)
    :raises LiftbridgeArgumentError: a bad argument (at parse time when it is not templated).
    """

    template_fields: Sequence[str] = (
        "stream",
        "partitions",
        "cursor_id",
        "group_id",
        "start_at",
        "start_time",
        "end_time",
        "liftbridge_conn_id",
        "dead_letters",
    )
    #: Buttons on the task instance page that open the Liftbridge view (docs/ui.md).
    operator_extra_links = (LiftbridgeStreamLink(), LiftbridgePipelineLink())
    argument_checks = {
        "partitions": parse_partitions,
        "cursor_id": optional(check_name),
        "group_id": optional(check_name),
        "start_at": parse_reading_start,
        "max_messages": optional(check_positive_int),
        "max_batch_size": check_positive_int,
        "commit_cadence": check_choice(COMMIT_CADENCES),
        "min_messages": optional(check_non_negative_int),
        "poll_timeout": check_timeout,
        "deferrable": check_bool,
        "read_by": check_choice(READ_BY),
        "start_time": parse_time,
        "end_time": parse_time,
        "allowed_lateness": check_lateness,
        "max_poll_interval": check_timeout,
        "dead_letters": check_dead_letters,
    }

    def __init__(
        self,
        *,
        stream: str,
        partitions: Any = None,
        cursor_id: str | None = None,
        group_id: str | None = None,
        start_at: Any = "earliest",
        max_messages: int | None = None,
        max_batch_size: int = 1000,
        commit_cadence: str = "end_of_batch",
        min_messages: int | None = None,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        read_by: str = "position",
        start_time: Any = None,
        end_time: Any = None,
        allowed_lateness: Any = DEFAULT_LATENESS,
        max_poll_interval: float | None = MAX_POLL_INTERVAL,
        dead_letters: DeadLetterStream | None = None,
        on_error: str | None = None,
        dead_letter_stream: str | None = None,
        create_dead_letter_stream: bool | None = None,
        **kwargs: Any,
    ) -> None:
        #: Where what cannot be processed goes (``None``: it fails the task), see the class.
        self.dead_letters = dead_letters_from_keywords(
            dead_letters, on_error, dead_letter_stream, create_dead_letter_stream
        )
        self.partitions = partitions
        self.cursor_id = cursor_id
        self.group_id = group_id
        self.start_at = start_at
        self.max_messages = max_messages
        self.max_batch_size = max_batch_size
        self.commit_cadence = commit_cadence
        self.min_messages = min_messages
        self.poll_timeout = poll_timeout
        self.read_by = read_by
        self.start_time = start_time
        self.end_time = end_time
        self.allowed_lateness = allowed_lateness
        self.deferrable = deferrable
        self.max_poll_interval = max_poll_interval
        super().__init__(stream=stream, **kwargs)

    # -- arguments ----------------------------------------------------------------------------
    def check_combination(self, *, rendered: bool) -> None:
        """Runs :meth:`check_arguments` (what this class and its subclasses check together)."""
        super().check_combination(rendered=rendered)
        self.check_arguments(rendered=rendered)

    def check_arguments(self, *, rendered: bool) -> None:
        """What depends on several arguments (each one alone is checked by ``argument_checks``):
        a position (``cursor_id`` or ``group_id``, one of them), no ``partitions`` with a group.
        Subclasses add theirs; a value that waits for rendering is checked after rendering.

        :raises LiftbridgeArgumentError: the argument at fault is named, with the fix.
        """
        check_read_by_arguments(self, rendered=rendered)
        cursor, group = self.cursor_id, self.group_id
        if self.read_by == "interval":
            return
        if not cursor and not group:
            raise LiftbridgeArgumentError(
                "give cursor_id (the cursor that keeps this task's position) or group_id (a consumer group):"
                " a reading task has no default position, so it never silently starts over"
            )
        if cursor and group:
            raise LiftbridgeArgumentError("give cursor_id or group_id, not both")
        partitions = self.partitions
        if group and (rendered or not waits_for_rendering(partitions)) and parse_partitions(partitions) is not None:
            raise LiftbridgeArgumentError(
                "with group_id the consumer group assigns the partitions: leave partitions unset"
            )

    @property
    def _poll_timeout(self) -> float:
        return check_timeout(self.poll_timeout, "poll_timeout") or DEFAULT_POLL_TIMEOUT

    @property
    def position_cursor(self) -> str:
        """The cursor id holding the committed positions (the group's with ``group_id``)."""
        return group_cursor_id(self.group_id) if self.group_id else str(self.cursor_id)

    # -- what subclasses say ------------------------------------------------------------------
    def make_handler(self, client: LiftbridgeClient, context: Context) -> BatchHandler:
        """The batch handler (see :data:`~airflow_provider_liftbridge.client.reading.runner.BatchHandler`);
        called once per try, before the plan is made (so its checks fail before anything is
        planned or read)."""
        raise NotImplementedError

    def dead_letter_target(self) -> str | None:
        """The stream this task sends what it cannot process to (``None``: none), from
        ``dead_letters``; recorded in the pipeline registry for the UI view and in the lineage."""
        return str(self.dead_letters.stream) if self.dead_letters is not None else None

    def open_dead_letters(self, client: LiftbridgeClient) -> DeadLetters | None:
        """The client's dead-letter publisher for ``dead_letters`` (``None``: none), its stream
        checked (and created, if asked) before anything is read.

        :raises NoSuchStreamError: the dead-letter stream does not exist (and is not to be created).
        """
        given = check_dead_letters(self.dead_letters)
        if given is None:
            return None
        dead = DeadLetters(client, given.stream)
        dead.check(create=given.create)
        return dead

    def describe_failure(self, failed: BatchFailed) -> str:
        """The task's error message for a batch that failed (default: the handler's words)."""
        return str(failed)

    def result(self, reports: dict[int, PartitionReport]) -> dict[str, Any]:
        """The XCom value: the stream, where positions live, a report per partition, totals."""
        where = {"group_id": self.group_id} if self.group_id else {"cursor_id": self.cursor_id}
        return {
            "stream": self.stream,
            **where,
            "partitions": {str(p): r.to_dict() for p, r in sorted(reports.items())},
            "processed": sum(r.processed for r in reports.values()),
            "dead_lettered": sum(r.dead_lettered for r in reports.values()),
        }

    # -- running ------------------------------------------------------------------------------
    def run(self, client: LiftbridgeClient, context: Context) -> Any:
        """Wait for ``min_messages`` (or, by interval, for the interval to be complete) if asked,
        plan, read, commit; return the XCom value.

        :raises TaskDeferred: waiting in the triggerer.
        :raises LiftbridgeAirflowError: the handler failed on a message (named by stream,
            partition and offset), or ``min_messages`` were not there within ``poll_timeout``.
        :raises NoTimestampsError: by interval, a partition's messages have no usable timestamps.
        """
        if self.read_by == "interval":
            return self._run_interval(client, context)
        with self._partitions(client) as (partitions, keep_reading, confirm_owner):
            plan_key, run_id = plan_key_of(context)
            planner = RangePlanner(
                client,
                self.stream,
                position_cursor=self.position_cursor,
                plan_key=plan_key,
                run_id=run_id,
                start_at=parse_reading_start(self.start_at),
                max_messages=optional(check_positive_int)(self.max_messages, "max_messages"),
            )
            partitions = planner.check_partitions(partitions)
            wait_for_min_messages(
                self,
                planner,
                partitions,
                wanted=optional(check_non_negative_int)(self.min_messages, "min_messages"),
                poll_timeout=self._poll_timeout,
                deferrable=self.deferrable,
                liftbridge_conn_id=self.liftbridge_conn_id,
            )
            handler = self.make_handler(client, context)  # its checks fail before anything is planned or read
            plans = planner.plan(partitions)
            self.planned(plans)
            self._log_plans(plans)
            if not all(plan.resumed for plan in plans):  # once per run: the UI view finds the pipeline
                self._record_pipeline(client, context, plan_key, run_id, plans)
            reports = self._read(client, plans, handler, self.position_cursor, keep_reading, confirm_owner)
            self._record_run(client, context, run_id, reports)
        return self._summarize(reports, self.result(reports))

    def _run_interval(self, client: LiftbridgeClient, context: Context) -> Any:
        """``read_by="interval"``: wait for the interval, plan it, read it with the shared batches
        and commits (to the interval's progress cursors), mark it done. Recorded in the pipeline
        registry and the run history as by position, with the interval."""
        plan_key, run_id = plan_key_of(context)
        planner, partitions = wait_for_interval(self, client, context, parse_partitions(self.partitions), plan_key)
        handler = self.make_handler(client, context)  # its checks fail before anything is planned or read
        plans = planner.plan(partitions)
        self.planned(plans)
        self._log_plans(plans)
        if not all(plan.resumed for plan in plans):  # once per reading of the interval, as by position
            self._record_pipeline(client, context, plan_key, run_id, plans, planner)
        reports = self._read(client, plans, handler, planner.progress_cursor, None, None)
        planner.finish([p.partition for p in plans])
        self._record_run(client, context, run_id, reports, planner.interval)
        result = self.result(reports) | {"read_by": "interval", "interval": planner.interval.to_dict()}
        for plan in plans:
            result["partitions"][str(plan.partition)]["interval_first_offset"] = plan.start
        if not any(plan.end > plan.start for plan in plans):
            self.log.info(
                "The interval [%s, %s) holds no messages on stream %r partitions %s: nothing to read",
                planner.interval.start.isoformat(),
                planner.interval.end.isoformat(),
                self.stream,
                [p.partition for p in plans],
            )
            result["empty"] = True
        return self._summarize(reports, result)

    def planned(self, plans: list[PartitionPlan]) -> None:
        """Told the plans before the handler is made and anything is read (default: nothing)."""

    def _read(
        self,
        client: LiftbridgeClient,
        plans: list[PartitionPlan],
        handler: BatchHandler,
        position_cursor: str,
        keep_reading: KeepReading | None,
        confirm_owner: ConfirmOwner | None,
    ) -> dict[int, PartitionReport]:
        """:func:`read_plan` with this task's batch size and cadence; a failed batch becomes the
        task's error, naming the message; a batch back after ``max_poll_interval`` (the member
        left the group) too, naming what to do."""
        try:
            return read_plan(
                client,
                plans,
                handler,
                position_cursor=position_cursor,
                max_batch_size=int(self.max_batch_size),
                commit_cadence=check_cadence(self.commit_cadence),
                keep_reading=keep_reading,
                confirm_owner=confirm_owner,
            )
        except MaxPollIntervalExceededError as exc:
            raise LiftbridgeAirflowError(
                f"{self.task_id}: {exc} (the task's max_poll_interval parameter). Nothing was committed for that"
                " batch: a retry of this task reads on from the group's committed position"
            ) from exc
        except BatchFailed as failed:
            message = failed.message
            report = failed.reports.get(message.partition)
            self.log.error(
                "stream %r partition %d offset %d failed: %s (position committed up to offset %s)",
                message.stream,
                message.partition,
                message.offset,
                failed,
                report.committed if report else "unknown",
            )
            raise LiftbridgeAirflowError(self.describe_failure(failed)) from failed.__cause__

    def _summarize(self, reports: dict[int, PartitionReport], result: dict[str, Any]) -> dict[str, Any]:
        emit_reading_stats(self.dag_id, self.task_id, self.stream, reports)
        self.log.info(
            "Read stream %r: %d message(s) processed, %d dead-lettered",
            self.stream,
            result["processed"],
            result["dead_lettered"],
        )
        return result

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired: look again, then read. Each trigger fires once its
        condition holds (the ``min_messages`` are committed; every partition is complete for the
        interval), so the look finds it holding and the task does not defer again.

        :raises LiftbridgeAirflowError: the trigger reported an error.
        """
        if event and event.get("status") == "error":
            raise LiftbridgeAirflowError(f"{self.task_id}: waiting for messages failed: {event.get('message')}")
        #: By interval: the triggerer's clock when it found the interval complete (see interval_reading).
        self.trigger_clock_ns = (event or {}).get("checked_at_ns")
        return self.execute(context)

    @contextmanager
    def _partitions(
        self, client: LiftbridgeClient
    ) -> Iterator[tuple[list[int] | None, KeepReading | None, ConfirmOwner | None]]:
        """The partitions to read (the given ones, ``None``: all) and, in a consumer group, the
        check that a partition is still this task's; the member leaves the group when the block ends.

        A group member reads only after the hand-over wait of the partitions it took over
        (:func:`.group_member.group_partitions`).
        """
        if not self.group_id:
            yield parse_partitions(self.partitions), None, None
            return
        limit = check_timeout(self.max_poll_interval, "max_poll_interval")
        with group_partitions(client, str(self.group_id), self.stream, limit, self.log) as found:
            yield found

    def _record_pipeline(
        self,
        client: LiftbridgeClient,
        context: Context,
        plan_key: str,
        run_id: str,
        plans: list[PartitionPlan],
        interval: IntervalPlanner | None = None,
    ) -> None:
        """Note this task in the pipeline registry (see ``docs/ui.md``), reading by interval with
        its progress cursors' prefix and the planned interval; a failure is logged, never fatal:
        the registry only makes the pipeline visible, reading does not depend on it."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", None)
        by_interval: dict[str, Any] = {}
        if interval is not None:
            start, end = interval.interval.ms
            by_interval = {
                "read_by": "interval",
                "interval_start": start,
                "interval_end": end,
                "interval_offsets": tuple((plan.partition, plan.start, plan.end) for plan in plans),
            }
        entry = PipelineEntry(
            stream=self.stream,
            position_cursor=self.position_cursor if interval is None else interval.cursor_prefix,
            plan_key=plan_key,
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            map_index=map_index if isinstance(map_index, int) else -1,
            run_id=run_id,
            partitions=tuple(plan.partition for plan in plans),
            cursor_id=self.cursor_id or None,
            group_id=self.group_id or None,
            operator=type(self).__name__,
            dead_letter_stream=self.dead_letter_target(),
            **by_interval,
        )
        try:
            record_pipeline(client, entry)
        except LiftbridgeError as exc:
            self.log.warning("could not record this pipeline for the Liftbridge UI view (%s); reading goes on", exc)

    def _record_run(
        self,
        client: LiftbridgeClient,
        context: Context,
        run_id: str,
        reports: dict[int, PartitionReport],
        interval: Interval | None = None,
    ) -> None:
        """Append this try to the run history the view charts (see ``docs/ui.md``), with the
        interval it read, if by interval; a failure is logged, never fatal, as for the registry."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", None)
        entry = RunEntry(
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            map_index=map_index if isinstance(map_index, int) else -1,
            run_id=run_id,
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
            interval=None if interval is None else interval.ms,
        )
        try:
            record_run(client, entry)
        except LiftbridgeError as exc:
            self.log.warning("could not record this run for the Liftbridge UI view's charts (%s); reading goes on", exc)

    def _log_plans(self, plans: list[PartitionPlan]) -> None:
        for plan in plans:
            self.log.info(
                "stream %r partition %d: %s plan, offsets %d..%d (%d to read; high watermark %d)",
                plan.stream,
                plan.partition,
                "this run's" if plan.resumed else "new",
                plan.next_offset,
                plan.last_offset,
                plan.remaining,
                plan.high_watermark,
            )

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the stream."""
        return [self.lineage_stream(self.stream)], []
