"""``LiftbridgeReadingOperator``: the base of the operators that read a stream in planned ranges
(:class:`~.consume.LiftbridgeConsumeOperator`, the stream-to-file archiver).

The operator translates Airflow's context into the reading: the try (:class:`TaskRun`: task, run,
the run's time window) and the mode given as ``read`` (:mod:`.read_modes`), whose strategy
(:mod:`airflow_provider_liftbridge.client.reading.strategies`) chooses the partitions, says what to
wait for, plans, completes and keeps the books. Here: waiting in the worker or the triggerer, the
batched read with its commits (:func:`~airflow_provider_liftbridge.client.reading.read_plan`), the
XCom and the lineage. A subclass says what a batch is for: :meth:`make_handler`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import Context, conf

from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError
from airflow_provider_liftbridge.client.consumer import MaxPollIntervalExceededError
from airflow_provider_liftbridge.client.reading import (
    BatchFailed,
    BatchHandler,
    PartitionPlan,
    PartitionReport,
    ReadingStrategy,
    TaskRun,
    Wait,
    WaitTimedOutError,
    check_cadence,
    read_plan,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.triggers.interval import LiftbridgeIntervalTrigger
from airflow_provider_liftbridge.triggers.offset import LiftbridgeCountTrigger
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_bool,
    check_partition_list,
    check_positive_int,
    waits_for_rendering,
)

from .base import LiftbridgeBaseOperator
from .dead_letters import DeadLetterStream, check_dead_letters
from .deferral import defer_unless_reached
from .links import LiftbridgePipelineLink, LiftbridgeStreamLink
from .metrics import emit_reading_stats
from .partitions import partition_of, partition_window
from .read_modes import ConsumerGroup, DataInterval, ReadMode, check_read, reject_old_keywords

__all__ = ["LiftbridgeReadingOperator", "parse_partitions", "task_run_of"]

#: The trigger of each kind of wait a strategy names (:attr:`Wait.trigger`).
TRIGGERS = {"count": LiftbridgeCountTrigger, "interval": LiftbridgeIntervalTrigger}


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


def task_run_of(
    context: Context,
    read: ReadMode,
    *,
    operator: str = "",
    dead_letter_stream: str | None = None,
    clock_floor_ns: Any = None,
) -> TaskRun:
    """The running try as a reading strategy sees it: task, run, and (for :class:`DataInterval`
    without both times) the run's window: a partitioned run's partition window, else its data interval.

    :raises LiftbridgeArgumentError: no task instance in the context (the operator runs outside a
        DAG run), or a partition key naming no time or a timetable with no next time.
    """
    ti = context.get("ti")
    run_id = context.get("run_id")
    if ti is None or not run_id:
        raise LiftbridgeArgumentError(
            "a reading operator plans per DAG run and needs the task instance: run it in a DAG (dag.test() works)"
        )
    map_index = getattr(ti, "map_index", None)
    window = None
    if isinstance(read, DataInterval) and read.uses_run_window():
        partition = partition_of(context)
        if partition is not None:
            window = partition_window(context, partition)
        else:
            window = (context.get("data_interval_start"), context.get("data_interval_end"))
    return TaskRun(
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=str(run_id),
        map_index=map_index if isinstance(map_index, int) and map_index >= 0 else -1,
        operator=operator,
        dead_letter_stream=dead_letter_stream,
        window=window,
        clock_floor_ns=clock_floor_ns
        if isinstance(clock_floor_ns, int) and not isinstance(clock_floor_ns, bool)
        else None,
    )


class LiftbridgeReadingOperator(LiftbridgeLineageMixin, LiftbridgeBaseOperator):
    """Read a stream in ranges planned once per DAG run, the range chosen by ``read``.

    ``read`` is the mode, one value: :class:`~.read_modes.SinceLastRun` (what arrived since the
    last run, positions in a cursor), :class:`~.read_modes.ConsumerGroup` (the same from a consumer
    group's positions, on the partitions the group assigns) or :class:`~.read_modes.DataInterval`
    (every message of the run's data interval, the same in every try, clear and backfill). At its
    start a try plans, per partition, the range to read, unless an earlier try of the same run
    already did: then it goes on with that plan, so a retry never reads what arrived after the
    plan. Batches of up to ``batch_size`` go to :meth:`make_handler`'s handler; positions move
    after each. See ``docs/consume.md``.

    :param stream: the stream to read. (templated)
    :param read: what to read: ``SinceLastRun(cursor_id, ...)``, ``ConsumerGroup(group_id, ...)``
        or ``DataInterval(lateness, ...)`` (their text fields templated).
    :param partitions: the partitions to read (default: all; not with ``ConsumerGroup``, whose
        group assigns them); a list, one number, or their text, so ``.expand(partitions=[[0], [1]])``
        maps one task per partition. (templated)
    :param batch_size: messages per batch (default 1000).
    :param deferrable: wait (for ``min_messages``, or until the interval is complete) in the
        triggerer (default: ``[operators] default_deferrable``).
    :param dead_letters: where a message that cannot be processed goes, a
        :class:`~.dead_letters.DeadLetterStream` (its ``stream`` and whether to ``create`` it):
        published there with why in its headers, acknowledged before the position moves past it,
        and the read goes on. ``None`` (default): such a message fails the task, the position
        stays before it. (templated: its ``stream``)
    :param liftbridge_conn_id: the connection to use. (templated)
    :raises LiftbridgeArgumentError: a bad argument (at parse time when it is not templated); a
        keyword of the old forms (``cursor_id``, ``read_by``, ...) names its new form.
    """

    template_fields: Sequence[str] = ("stream", "read", "partitions", "liftbridge_conn_id", "dead_letters")
    #: Buttons on the task instance page that open the Liftbridge view (docs/ui.md).
    operator_extra_links = (LiftbridgeStreamLink(), LiftbridgePipelineLink())
    argument_checks = {
        "read": check_read,
        "partitions": parse_partitions,
        "batch_size": check_positive_int,
        "deferrable": check_bool,
        "dead_letters": check_dead_letters,
    }
    #: When positions move (``docs/consume.md``); the consume operator makes it a parameter.
    commit_cadence: Any = "end_of_batch"

    def __init__(
        self,
        *,
        stream: str,
        read: ReadMode | None = None,
        partitions: Any = None,
        batch_size: int = 1000,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        dead_letters: DeadLetterStream | None = None,
        **kwargs: Any,
    ) -> None:
        reject_old_keywords(type(self).__name__, kwargs.get("task_id"), kwargs)
        if read is None:
            raise LiftbridgeArgumentError(
                f"{type(self).__name__} (task_id {kwargs.get('task_id')!r}) needs read=: what to read, e.g. "
                "read=SinceLastRun('orders-reader'), read=ConsumerGroup('billing') or read=DataInterval(); a "
                "reading task has no default position, so it never silently starts over"
            )
        #: What to read (a copy: each task renders its own templates).
        self.read = read.copy() if isinstance(read, ReadMode) else read
        self.partitions = partitions
        self.batch_size = batch_size
        self.deferrable = deferrable
        #: Where what cannot be processed goes (``None``: it fails the task), see the class.
        self.dead_letters = dead_letters
        #: The strategy of the try under way (set while :meth:`run` runs).
        self.reading: ReadingStrategy | None = None
        super().__init__(stream=stream, **kwargs)

    # -- arguments ----------------------------------------------------------------------------
    def check_combination(self, *, rendered: bool) -> None:
        """Runs :meth:`check_arguments` (what this class and its subclasses check together)."""
        super().check_combination(rendered=rendered)
        self.check_arguments(rendered=rendered)

    def check_arguments(self, *, rendered: bool) -> None:
        """What depends on several arguments (each one alone is checked by ``argument_checks``):
        the mode's fields, no ``partitions`` with a consumer group. Subclasses add theirs; a value
        that waits for rendering is checked after rendering.

        :raises LiftbridgeArgumentError: the argument at fault is named, with the fix.
        """
        read = check_read(self.read)
        read.check(rendered=rendered)
        partitions = self.partitions
        if (
            isinstance(read, ConsumerGroup)
            and (rendered or not waits_for_rendering(partitions))
            and parse_partitions(partitions) is not None
        ):
            raise LiftbridgeArgumentError(
                "with read=ConsumerGroup(...) the consumer group assigns the partitions: leave partitions unset"
            )

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

    def describe_failure(self, failed: BatchFailed) -> str:
        """The task's error message for a batch that failed (default: the handler's words)."""
        return str(failed)

    def result(self, reports: dict[int, PartitionReport], mode: dict[str, Any]) -> dict[str, Any]:
        """The XCom value: the stream, the mode's part (where positions live; the interval read),
        a report per partition, totals."""
        return {
            "stream": self.stream,
            **mode,
            "partitions": {str(p): r.to_dict() for p, r in sorted(reports.items())},
            "processed": sum(r.processed for r in reports.values()),
            "dead_lettered": sum(r.dead_lettered for r in reports.values()),
        }

    def planned(self, plans: list[PartitionPlan]) -> None:
        """Told the plans before the handler is made and anything is read (default: nothing)."""

    # -- running ------------------------------------------------------------------------------
    def run(self, client: LiftbridgeClient, context: Context) -> Any:
        """Wait if the mode says so (``min_messages``; an interval to be complete), plan, read,
        commit, complete; return the XCom value.

        :raises TaskDeferred: waiting in the triggerer.
        :raises LiftbridgeAirflowError: the handler failed on a message (named by stream,
            partition and offset), or what the task waited for did not come in time.
        :raises NoTimestampsError: by interval, a partition's messages have no usable timestamps.
        """
        read = check_read(self.read)
        run = task_run_of(
            context,
            read,
            operator=type(self).__name__,
            dead_letter_stream=self.dead_letter_target(),
            clock_floor_ns=getattr(self, "trigger_clock_ns", None),
        )
        with read.strategy(client, self.stream, run, self.log) as reading:
            self.reading = reading
            reading.open(parse_partitions(self.partitions))
            wait = reading.wait()
            if wait is not None:
                self._wait(wait)
            handler = self.make_handler(client, context)  # its checks fail before anything is planned or read
            plans = reading.plan()
            self.planned(plans)
            self._log_plans(plans)
            try:
                reading.register(plans)
            except LiftbridgeError as exc:
                self.log.warning("could not record this pipeline for the Liftbridge UI view (%s); reading goes on", exc)
            reports = self._read(client, plans, handler, reading)
            reading.finish(plans)
            try:
                reading.record(reports)
            except LiftbridgeError as exc:
                self.log.warning(
                    "could not record this run for the Liftbridge UI view's charts (%s); reading goes on", exc
                )
            mode = reading.result(plans, reports)
        return self._summarize(reports, self.result(reports, mode))

    def _wait(self, wait: Wait) -> None:
        """Wait in the worker, or (``deferrable``) in the triggerer unless one look finds it there.

        :raises TaskDeferred: waiting in the triggerer.
        :raises LiftbridgeAirflowError: it did not come in time (in the worker).
        """
        if self.deferrable:
            defer_unless_reached(  # returns when it is there; else raises TaskDeferred
                self,
                check=wait.ready,
                trigger=lambda: TRIGGERS[wait.trigger](
                    **wait.trigger_arguments(), liftbridge_conn_id=self.liftbridge_conn_id
                ),
                timeout=None if wait.timeout is None else timedelta(seconds=wait.timeout),
                method_name="execute_complete",
            )
            return
        try:
            wait.poll()
        except WaitTimedOutError as exc:
            raise LiftbridgeAirflowError(str(exc)) from None

    def _read(
        self, client: LiftbridgeClient, plans: list[PartitionPlan], handler: BatchHandler, reading: ReadingStrategy
    ) -> dict[int, PartitionReport]:
        """:func:`read_plan` with this task's batch size and cadence; a failed batch becomes the
        task's error, naming the message; a batch back after ``max_poll_interval`` (the member
        left the group) too, naming what to do."""
        try:
            return read_plan(
                client,
                plans,
                handler,
                position_cursor=reading.position_cursor,
                batch_size=int(self.batch_size),
                commit_cadence=check_cadence(self.commit_cadence),
                keep_reading=reading.keep_reading,
                confirm_owner=reading.confirm_owner,
            )
        except MaxPollIntervalExceededError as exc:
            raise LiftbridgeAirflowError(
                f"{self.task_id}: {exc} (ConsumerGroup's max_poll_interval). Nothing was committed for that"
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
        #: By interval: the triggerer's clock when it found the interval complete (see TaskRun).
        self.trigger_clock_ns = (event or {}).get("checked_at_ns")
        return self.execute(context)

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
