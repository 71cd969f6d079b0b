"""Reading planned ranges in batches and committing positions after each batch is done.

:func:`read_plan` walks every partition's plan (:class:`~.plan.PartitionPlan`) over one
subscription per partition, hands each batch of up to ``batch_size`` messages to a handler,
and moves the position cursor as the commit cadence says, never past a message the handler did
not finish. The subscription is closed however the walk ends.

Two things keep the walk close to the cost of the subscription itself (``bench/reading_bench.py``):

- a batch's commit runs on a helper thread while the next batch is read, and is waited for
  before that batch goes to the handler (:class:`_Committer`): the round trip no longer stalls
  the read, and the order of commits and handler calls is the same as with a commit in line;
- the cyclic GC's young-generation threshold is raised above a batch's worth of objects while
  the walk runs (:func:`_batch_sized_gc`): a batch's messages hold no cycles and reference
  counting frees them when the batch is dropped, but with the default threshold (700) each batch
  of 1,000 set off young collections that moved them into older generations, and now and then a
  full collection of the whole process.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal

from ..errors import InvalidArgumentError
from ..sync_client import LiftbridgeClient
from ..types import Message
from .plan import PartitionPlan, high_watermark

__all__ = [
    "COMMIT_CADENCES",
    "BatchFailed",
    "BatchHandler",
    "CommitCadence",
    "PartitionReport",
    "batches",
    "check_batch_size",
    "check_cadence",
    "read_plan",
]

log = logging.getLogger("airflow_provider_liftbridge.client.reading")

#: When positions move: after each batch the handler finished (``end_of_batch``), once after
#: every partition's plan is done (``end_of_operator``), or not at all (``never``).
CommitCadence = Literal["end_of_batch", "end_of_operator", "never"]
COMMIT_CADENCES: tuple[str, ...] = ("end_of_batch", "end_of_operator", "never")


def check_cadence(value: Any) -> CommitCadence:
    """:raises InvalidArgumentError: not one of :data:`COMMIT_CADENCES`."""
    if value not in COMMIT_CADENCES:
        raise InvalidArgumentError(f"commit_cadence must be one of {', '.join(COMMIT_CADENCES)}; got {value!r}")
    return value  # type: ignore[no-any-return]


def check_batch_size(value: Any) -> int:
    """:raises InvalidArgumentError: not a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"batch_size must be a whole number of at least 1, got {value!r}")
    return value


class BatchFailed(Exception):
    """Raised by a batch handler that could not finish a batch: the first ``done`` messages of
    the batch are finished (their position may be committed), ``batch[done]`` failed with
    ``__cause__``; nothing from ``batch[done]`` on counts as processed.

    :param done: how many messages at the start of the batch were finished.
    :param message: the message that failed.
    """

    def __init__(self, done: int, message: Message, why: str) -> None:
        self.done = done
        self.message = message
        #: The reports of every partition up to the failure (set by :func:`read_plan`).
        self.reports: dict[int, PartitionReport] = {}
        super().__init__(why)


@dataclass
class PartitionReport:
    """What a try did on one partition (the reading operators' XCom, one entry per partition).

    ``first_offset`` / ``last_offset``: the first and last offset processed in this try
    (``None``: none); ``processed``: messages handed to the handler and finished (dead letters
    included); ``dead_lettered``: of those, how many the handler sent to a dead-letter stream;
    ``committed``: the position cursor after this try (``-1``: never set); ``plan_end``: the
    plan's exclusive end; ``lag``: committed messages after the last processed one when the try
    ended (what the next run will find, at least); ``plan_start``: the plan's first offset
    (``-1``: unknown; not in the XCom, for the archiver to find earlier tries' files).
    """

    stream: str
    partition: int
    plan_end: int
    resumed: bool
    first_offset: int | None = None
    last_offset: int | None = None
    processed: int = 0
    dead_lettered: int = 0
    committed: int = -1
    lag: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    plan_start: int = -1

    def note(self, batch: Sequence[Message], dead_lettered: int) -> None:
        """Count a finished batch (or the finished start of one)."""
        if not batch:
            return
        if self.first_offset is None:
            self.first_offset = batch[0].offset
        self.last_offset = batch[-1].offset
        self.processed += len(batch)
        self.dead_lettered += dead_lettered

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (XCom)."""
        out = {
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "processed": self.processed,
            "dead_lettered": self.dead_lettered,
            "committed": self.committed,
            "plan_end": self.plan_end,
            "resumed": self.resumed,
            "lag": self.lag,
        }
        return out | self.extra


#: A batch handler: finishes every message of the batch and returns how many of them it sent to
#: a dead-letter stream, or raises :class:`BatchFailed` (any other exception counts as failing at
#: the batch's first message).
BatchHandler = Callable[[list[Message]], int]


def batches(client: LiftbridgeClient, plan: PartitionPlan, batch_size: int) -> Generator[list[Message], None, None]:
    """The messages of ``plan``'s remaining range, in lists of up to ``batch_size``, over one
    subscription (closed when this generator is closed or exhausted).

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the partition went away.
    """
    if plan.remaining == 0:
        return
    # resume=True: a paused partition (idle auto-pause, or paused by hand) still holds what the
    # plan covers; reading it resumes it, as any Liftbridge reader that wants its data must.
    messages = client.subscribe(
        plan.stream, partition=plan.partition, start_at=plan.next_offset, stop_at=plan.last_offset, resume=True
    )
    last = plan.last_offset
    try:
        while True:
            batch = list(islice(messages, batch_size))  # at C speed: this loop is the hot path
            if not batch:
                return
            if batch[-1].offset >= last:
                # The subscription ends at the stop offset; a compacted range can end past it.
                batch = [m for m in batch if m.offset <= last]
                if batch:
                    yield batch
                return
            yield batch
            # Let go of this batch before the next one is read (the caller does too, see
            # read_plan): one batch of messages alive instead of two keeps the memory they free
            # warm for the next and halves what the cyclic GC walks (~7 % of the CPU per message).
            del batch
    finally:
        messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription


#: Objects the cyclic GC tracks per message of a batch while it is alive: the message, its
#: headers, and what a handler makes of it (a decoded value, a row): an estimate, for
#: :func:`_batch_sized_gc`.
GC_OBJECTS_PER_MESSAGE = 4
#: The highest young-generation threshold :func:`_batch_sized_gc` sets (bounds the cyclic garbage
#: a handler can leave before a collection, whatever the batch size).
GC_THRESHOLD_CAP = 1_000_000


@contextmanager
def _batch_sized_gc(batch_size: int) -> Iterator[None]:
    """Run the block with the cyclic GC's young-generation threshold at least
    :data:`GC_OBJECTS_PER_MESSAGE` × ``batch_size`` (capped at :data:`GC_THRESHOLD_CAP`), and
    set it back afterwards unless someone changed it meanwhile.

    A batch's messages then come and go without a collection: they count as young objects while
    they are alive, and reference counting frees them (no cycles) when the batch is dropped, which
    takes them off the count again. With the default threshold, holding a batch of 1,000 cost
    0.7-0.9 µs per message in collections, most of it in full collections of an Airflow process's
    ~170,000 objects. Cyclic garbage a handler leaves is still collected, after at most that many
    new objects. A disabled collector (threshold 0) stays disabled; a higher threshold stays.
    """
    old = gc.get_threshold()
    wanted = min(max(GC_OBJECTS_PER_MESSAGE * batch_size, old[0]), GC_THRESHOLD_CAP)
    if old[0] == 0 or wanted <= old[0]:
        yield
        return
    gc.set_threshold(wanted, *old[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == wanted:
            gc.set_threshold(*old)


class _Committer:
    """Moves a position cursor on a helper thread, one commit at a time, so that the round trip
    overlaps reading the next batch.

    :meth:`start` hands a commit over; :meth:`wait` returns once it is done (and records it in the
    partition's report) or raises its error. :func:`read_plan` waits before anything happens to
    the next batch (the group check, the handler) and before any other commit, so a batch reaches
    the handler only after the commit of the one before it succeeded, as with a commit in line.
    The thread is started by the first commit (never with another cadence).
    """

    def __init__(self, client: LiftbridgeClient, position_cursor: str) -> None:
        self._client = client
        self._cursor = position_cursor
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[PartitionReport, int, Future[None]] | None = None

    def start(self, report: PartitionReport, offset: int) -> None:
        """Commit ``offset`` as ``report``'s partition's position, in the background (after the
        commit in flight, if any, is done).

        :raises LiftbridgeError: the commit in flight failed.
        """
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="liftbridge-commit")
        future = self._pool.submit(self._client.set_cursor, self._cursor, report.stream, report.partition, offset)
        self._pending = (report, offset, future)

    def wait(self) -> None:
        """Return once no commit is in flight.

        :raises LiftbridgeError: the commit in flight failed (the report keeps the position before it).
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            report, offset, future = pending
            future.result()
            report.committed = offset

    def close(self, *, failing: bool) -> None:
        """Wait for the commit in flight and stop the thread. While another error is on its way
        (``failing``), a failed commit is logged instead of raised.

        :raises LiftbridgeError: the commit in flight failed (unless ``failing``).
        """
        try:
            self.wait()
        except Exception:
            if not failing:
                raise
            log.warning("committing the last finished batch failed as well", exc_info=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def read_plan(
    client: LiftbridgeClient,
    plans: Sequence[PartitionPlan],
    handler: BatchHandler,
    *,
    position_cursor: str,
    batch_size: int = 1000,
    commit_cadence: CommitCadence = "end_of_batch",
    keep_reading: Callable[[PartitionPlan], bool] | None = None,
    confirm_owner: Callable[[], None] | None = None,
) -> dict[int, PartitionReport]:
    """Read every plan in batches, hand each batch to ``handler``, commit as the cadence says.

    With ``end_of_batch`` the position moves to the last message of each batch the handler
    finished; when it raises :class:`BatchFailed`, to the last message before the failing one
    (never past it) before the error goes on. With ``end_of_operator`` every partition's position
    moves once, after all plans are done (a failure commits nothing). With ``never`` nothing moves.

    ``keep_reading(plan)`` is asked before each batch (a consumer group's assignment check): when
    it says no, the partition's reading stops there (its report gets ``moved_away``).
    ``confirm_owner()`` is called before each commit (a consumer group's membership check): it
    raises when the reader may no longer store positions (its member left the group after a batch
    slower than ``max_poll_interval``), and nothing is committed then.

    :return: a report per partition (XCom material, see :class:`PartitionReport`).
    :raises BatchFailed: the handler failed (``__cause__``: its error); the reports so far are in
        ``.reports``.
    :raises LiftbridgeError: reading or committing failed.
    """
    check_cadence(commit_cadence)
    check_batch_size(batch_size)
    reports = {
        p.partition: PartitionReport(
            p.stream, p.partition, p.end, p.resumed, committed=p.next_offset - 1, plan_start=p.start
        )
        for p in plans
    }

    def commit(report: PartitionReport, offset: int) -> None:
        if confirm_owner is not None:
            confirm_owner()
        client.set_cursor(position_cursor, report.stream, report.partition, offset)
        report.committed = offset

    committer = _Committer(client, position_cursor)
    failing = True
    try:
        with _batch_sized_gc(batch_size):
            for plan in plans:
                report = reports[plan.partition]
                if plan.resumed:
                    log.info(
                        "stream %r partition %d: resuming this run's plan at offset %d (plan ends before %d, %d left)",
                        plan.stream,
                        plan.partition,
                        plan.next_offset,
                        plan.end,
                        plan.remaining,
                    )
                checks = (keep_reading, confirm_owner)
                _read_partition(client, plan, report, handler, batch_size, commit_cadence, checks, committer)
                committer.wait()
            if commit_cadence == "end_of_operator":
                for report in reports.values():
                    if report.last_offset is not None:
                        commit(report, report.last_offset)
        failing = False
    except BatchFailed as failed:
        failed.reports = reports
        raise
    finally:
        committer.close(failing=failing)
    for plan in plans:
        report = reports[plan.partition]
        done_to = report.last_offset if report.last_offset is not None else plan.next_offset - 1
        hw = high_watermark(client, plan.stream, plan.partition)
        report.lag = max(0, hw - done_to)
    return reports


def _read_partition(
    client: LiftbridgeClient,
    plan: PartitionPlan,
    report: PartitionReport,
    handler: BatchHandler,
    batch_size: int,
    commit_cadence: CommitCadence,
    checks: tuple[Callable[[PartitionPlan], bool] | None, Callable[[], None] | None],
    committer: _Committer,
) -> None:
    """Read one plan in batches and hand them to ``handler``, committing as the cadence says (see
    :func:`read_plan`; ``checks``: its ``keep_reading`` and ``confirm_owner``); the commit of the
    last batch may still be in flight on return."""
    keep_reading, confirm_owner = checks
    reader = batches(client, plan, batch_size)
    try:
        for batch in reader:
            committer.wait()  # the commit of the batch before (read meanwhile) succeeded, or raises
            if keep_reading is not None and not keep_reading(plan):
                log.info(
                    "stream %r partition %d: no longer this reader's (moved to another group member);"
                    " stopping before offset %d",
                    plan.stream,
                    plan.partition,
                    batch[0].offset,
                )
                report.extra["moved_away"] = True
                break
            try:
                dead = handler(batch)
            except BatchFailed as failed:
                report.note(batch[: failed.done], 0)
                if failed.done and commit_cadence == "end_of_batch":
                    if confirm_owner is not None:
                        confirm_owner()
                    committer.start(report, batch[failed.done - 1].offset)
                    committer.wait()
                raise
            except Exception as exc:
                raise BatchFailed(0, batch[0], f"{type(exc).__name__}: {exc}") from exc
            report.note(batch, dead)
            if commit_cadence == "end_of_batch":
                if confirm_owner is not None:
                    confirm_owner()  # a batch back after max_poll_interval commits nothing
                committer.start(report, batch[-1].offset)
            del batch  # not alive while the next one is read (see batches)
    finally:
        reader.close()  # the subscription ends now, not when the generator is collected
