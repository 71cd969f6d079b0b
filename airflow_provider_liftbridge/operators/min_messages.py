"""Waiting for ``min_messages`` before a reading task plans its range (``read_by="position"``):
in the worker, looking at the stream every :data:`MIN_MESSAGES_POLL` seconds, or in the triggerer,
deferring on a count trigger (all the task's partitions together) once one look found too few.
Reading by interval waits in :mod:`.interval_reading` instead.
"""

from __future__ import annotations

import time
from datetime import timedelta

from airflow.sdk import BaseOperator

from airflow_provider_liftbridge.client import (
    NotLeaderError,
    PartitionPausedError,
    RequestTimeoutError,
    UnavailableError,
)
from airflow_provider_liftbridge.client.reading import RangePlanner
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError
from airflow_provider_liftbridge.triggers.offset import LiftbridgeCountTrigger

from .deferral import defer_unless_reached

__all__ = ["DEFAULT_POLL_TIMEOUT", "MIN_MESSAGES_POLL", "TRANSIENT_LOOK_ERRORS", "wait_for_min_messages"]

#: Seconds to wait for ``min_messages`` unless ``poll_timeout`` says otherwise (the Kafka operator's 60).
DEFAULT_POLL_TIMEOUT = 60.0
#: Seconds between two looks at the stream while waiting for ``min_messages`` in the worker.
MIN_MESSAGES_POLL = 1.0
#: Failures of one look at the stream that the worker's ``min_messages`` wait outlasts (no broker
#: reachable after the client's retries, e.g. while one restarts; a deadline missed under load; a
#: leader or a pause moving): it looks again until ``poll_timeout``. The look is only a way to
#: stop waiting early, so it never fails the task by itself (as the deferrable path defers).
TRANSIENT_LOOK_ERRORS = (UnavailableError, RequestTimeoutError, NotLeaderError, PartitionPausedError)


def wait_for_min_messages(
    task: BaseOperator,
    planner: RangePlanner,
    partitions: list[int],
    *,
    wanted: int | None,
    poll_timeout: float,
    deferrable: bool,
    liftbridge_conn_id: str,
) -> None:
    """Return once ``wanted`` messages are there to read on ``partitions`` (at once when
    ``wanted`` is 0 or unset, or when this run planned already); poll or defer until then.

    A look at the stream that fails with one of :data:`TRANSIENT_LOOK_ERRORS` is logged and
    repeated (in the worker) or leaves the wait to the trigger (deferrable).

    :param task: the reading task (its ``log``; ``defer`` and ``execute_complete`` when deferrable).
    :raises TaskDeferred: ``deferrable`` and not there yet.
    :raises LiftbridgeAirflowError: not there within ``poll_timeout`` (in the worker; the
        message names the last failed look, if the last one failed).
    """
    if not wanted or not partitions:
        return
    if planner.has_plan(partitions):
        task.log.info("This run planned already (an earlier try): reading the rest of its plan without waiting")
        return
    if deferrable:
        pending: dict[int, int] = {}

        def enough() -> bool:
            pending.update(planner.pending(partitions))
            return sum(pending.values()) >= wanted

        def trigger() -> LiftbridgeCountTrigger:
            now = pending or planner.pending(partitions)
            return _count_trigger(planner, now, wanted - sum(now.values()), liftbridge_conn_id)

        defer_unless_reached(  # returns when they are there; else raises TaskDeferred
            task,
            check=enough,
            trigger=trigger,
            timeout=timedelta(seconds=poll_timeout),
            method_name="execute_complete",
        )
        return
    deadline = time.monotonic() + poll_timeout
    have, failed, waiting = 0, "", False
    while True:
        try:
            have, failed = sum(planner.pending(partitions).values()), ""
        except TRANSIENT_LOOK_ERRORS as error:
            failed = f"{type(error).__name__}: {error}"
            task.log.warning("looking for min_messages failed (%s): looking again in %g s", failed, MIN_MESSAGES_POLL)
        else:
            if have >= wanted:
                task.log.info("%d message(s) to read (min_messages %d)", have, wanted)
                return
            if not waiting:
                task.log.info("%d of min_messages=%d message(s) there: waiting up to %g s", have, wanted, poll_timeout)
                waiting = True
        if time.monotonic() >= deadline:
            raise LiftbridgeAirflowError(
                f"only {have} of min_messages={wanted} message(s) arrived on stream {planner.stream!r} partitions"
                f" {partitions} within poll_timeout={poll_timeout:g} s: raise poll_timeout or lower min_messages"
                + (f" (the last look at the stream failed: {failed})" if failed else "")
            )
        time.sleep(MIN_MESSAGES_POLL)


def _count_trigger(
    planner: RangePlanner, pending: dict[int, int], missing: int, liftbridge_conn_id: str
) -> LiftbridgeCountTrigger:
    """Wait for the messages still missing on all the task's partitions together: each counts from
    its position + 1 (or, without a position, from where its pending messages start)."""
    starts = {}
    for partition, waiting in pending.items():
        position = planner.client.fetch_cursor(planner.position_cursor, planner.stream, partition)
        starts[partition] = position + 1 if position >= 0 else planner.high_watermark(partition) + 1 - waiting
    return LiftbridgeCountTrigger(
        stream=planner.stream,
        starts=starts,
        count=sum(pending.values()) + missing,
        liftbridge_conn_id=liftbridge_conn_id,
    )
