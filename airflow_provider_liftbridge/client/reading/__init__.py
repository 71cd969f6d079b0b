"""Reading streams in bounded, retry-safe ranges (the machinery of the reading operators).

- :mod:`.plan`: :class:`RangePlanner` fixes, per partition, the range one run reads
  (position + 1 .. high watermark, capped by ``max_messages``) and keeps it on the server as
  cursors, so a retry of the same run reads the same range and a new run plans afresh.
- :mod:`.interval`: :class:`IntervalPlanner` finds a time interval's offsets per partition
  (Liftbridge's time index), says when each partition is complete for it, and plans the read with
  per-interval progress cursors, so every try, clear and backfill reads the same messages.
- :mod:`.strategies`: one class per reading mode (:class:`SinceLastRunReading`,
  :class:`ConsumerGroupReading`, :class:`DataIntervalReading`): the partitions, the wait before
  planning, the plan, where positions go, completing, the registry and history entries.
- :mod:`.waits`: :class:`Wait`, what a strategy waits for before planning (looked at once,
  polled in the process, or handed to a trigger).
- :mod:`.runner`: :func:`read_plan` reads the plans in batches, hands them to a handler and moves
  the position cursor after each finished batch (or as the commit cadence says).
- :mod:`.dead_letter`: :class:`DeadLetters` publishes what could not be processed, with why;
  :func:`json_value` decodes a JSON value or names the offset that is not JSON.
- :mod:`.registry`: :func:`record_pipeline` notes, on the server, which task reads which stream
  with which cursor, so viewers can find the pipelines (:func:`read_pipelines`).
- :mod:`.history`: :func:`record_run` appends what each finished try did (per partition:
  processed, lag, high watermark) to a retention-limited stream, for charts (:func:`read_history`).

See ``docs/consume.md``. Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

from .dead_letter import (
    DEAD_LETTER_HEADERS,
    VALUE_FORMATS,
    DeadLetters,
    NotJsonError,
    NotTextError,
    dead_letter_headers,
    json_value,
    text_value,
)
from .history import HISTORY_STREAM, PartitionRun, RunEntry, read_history, record_run
from .interval import (
    DEFAULT_LATENESS,
    Interval,
    IntervalBounds,
    IntervalPlanner,
    NoTimestampsError,
    interval_cursor_ids,
    lateness_ns,
    latest_reading,
    partition_complete,
)
from .plan import (
    NO_PLAN,
    PartitionPlan,
    RangePlanner,
    StartSpec,
    check_partitions,
    first_offset_at,
    high_watermark,
    plan_cursor_ids,
    plan_start_cursor_id,
    run_tag,
)
from .registry import REGISTRY_STREAM, PipelineEntry, read_pipelines, record_pipeline
from .runner import (
    COMMIT_CADENCES,
    BatchFailed,
    BatchHandler,
    CommitCadence,
    PartitionReport,
    batches,
    check_batch_size,
    check_cadence,
    read_plan,
)
from .strategies import (
    ConsumerGroupReading,
    DataIntervalReading,
    ReadingStrategy,
    SinceLastRunReading,
    TaskRun,
)
from .waits import Wait, WaitTimedOutError

__all__ = [
    "COMMIT_CADENCES",
    "DEAD_LETTER_HEADERS",
    "HISTORY_STREAM",
    "DEFAULT_LATENESS",
    "NO_PLAN",
    "REGISTRY_STREAM",
    "VALUE_FORMATS",
    "BatchFailed",
    "BatchHandler",
    "CommitCadence",
    "ConsumerGroupReading",
    "DataIntervalReading",
    "DeadLetters",
    "Interval",
    "IntervalBounds",
    "IntervalPlanner",
    "NoTimestampsError",
    "NotJsonError",
    "NotTextError",
    "PartitionPlan",
    "PartitionReport",
    "PartitionRun",
    "PipelineEntry",
    "RangePlanner",
    "ReadingStrategy",
    "RunEntry",
    "SinceLastRunReading",
    "StartSpec",
    "TaskRun",
    "Wait",
    "WaitTimedOutError",
    "batches",
    "check_partitions",
    "check_batch_size",
    "check_cadence",
    "dead_letter_headers",
    "first_offset_at",
    "high_watermark",
    "interval_cursor_ids",
    "json_value",
    "latest_reading",
    "lateness_ns",
    "partition_complete",
    "plan_cursor_ids",
    "plan_start_cursor_id",
    "read_history",
    "read_pipelines",
    "read_plan",
    "record_pipeline",
    "record_run",
    "run_tag",
    "text_value",
]
