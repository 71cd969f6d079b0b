"""Metrics of the reading operators (the consume operator and the archiver), sent through
Airflow's ``Stats`` (StatsD, Datadog, OpenTelemetry: whatever ``[metrics]`` configures), so the
numbers of the Liftbridge view can feed alerts. Names and tags: ``docs/ui.md``.

Emitted once per finished try, at the end of ``execute``; nothing is sent when metrics are off.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow.sdk.observability.stats import Stats

from airflow_provider_liftbridge.client.reading import PartitionReport

__all__ = ["DEAD_LETTERED", "LAG", "PARTITION_LAG", "PROCESSED", "emit_reading_stats"]

#: Counter: messages a try processed (dead letters included).
PROCESSED = "liftbridge.reading.processed"
#: Counter: of those, the messages sent to the dead-letter stream.
DEAD_LETTERED = "liftbridge.reading.dead_lettered"
#: Gauge: committed messages after the last processed one, over the task's partitions, when the try ended.
LAG = "liftbridge.reading.lag"
#: Gauge: the same per partition (tag ``partition``).
PARTITION_LAG = "liftbridge.reading.partition_lag"


def emit_reading_stats(dag_id: str, task_id: str, stream: str, reports: Mapping[int, PartitionReport]) -> None:
    """Send one try's counts and lag, tagged with ``dag_id``, ``task_id`` and ``stream``."""
    tags = {"dag_id": dag_id, "task_id": task_id, "stream": stream}
    Stats.incr(PROCESSED, sum(r.processed for r in reports.values()), tags=tags)
    Stats.incr(DEAD_LETTERED, sum(r.dead_lettered for r in reports.values()), tags=tags)
    Stats.gauge(LAG, sum(r.lag for r in reports.values()), tags=tags)
    for partition, report in sorted(reports.items()):
        Stats.gauge(PARTITION_LAG, report.lag, tags=tags | {"partition": str(partition)})
