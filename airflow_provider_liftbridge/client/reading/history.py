"""The run history: one small entry per finished try of a reading task, kept in Liftbridge
beside the pipeline registry (:mod:`.registry`), so the Airflow UI view can chart lag and
messages read per run, and each stream's message rate, without a database of its own.

The history stream (:data:`HISTORY_STREAM`, one partition) is created by the first reading task
with a retention limit of :data:`HISTORY_MAX_MESSAGES` messages and :data:`HISTORY_MAX_AGE`: the
server deletes older entries, so it stays bounded whatever runs. An entry is a JSON value of a
few hundred bytes (about 60 bytes more per partition read).

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgumentError
from ..sync_client import LiftbridgeClient
from .registry import publish_entry, tail_entries

__all__ = [
    "HISTORY_MAX_AGE",
    "HISTORY_MAX_MESSAGES",
    "HISTORY_STREAM",
    "PartitionRun",
    "RunEntry",
    "read_history",
    "record_run",
]

#: The history stream (and its subject).
HISTORY_STREAM = "airflow-liftbridge-pipeline-history"
#: The stream's retention: at most this many entries ...
HISTORY_MAX_MESSAGES = 20_000
#: ... and none older than this.
HISTORY_MAX_AGE = timedelta(days=30)


@dataclass(frozen=True, slots=True)
class PartitionRun:
    """What one try did on one partition: messages processed (dead letters included), of those
    dead-lettered, the lag when it ended, and the partition's high watermark then (``-1``: empty)."""

    processed: int
    dead_lettered: int
    lag: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class RunEntry:
    """One finished try of a reading task.

    :param dag_id: / :param task_id: / :param map_index: the task (``-1``: not mapped).
    :param run_id: the DAG run.
    :param stream: the stream it read.
    :param partitions: per partition, what it did (:class:`PartitionRun`).
    :param recorded_at: when the try ended (milliseconds since the epoch).
    :param interval: reading by interval: the interval read, ``(start, end)`` in milliseconds
        since the epoch (``None``: read by position).
    """

    dag_id: str
    task_id: str
    run_id: str
    stream: str
    partitions: Mapping[int, PartitionRun]
    map_index: int = -1
    recorded_at: int = field(default_factory=lambda: int(time.time() * 1000))
    interval: tuple[int, int] | None = None

    def to_json(self) -> bytes:
        """The history message's value."""
        interval = {} if self.interval is None else {"interval": list(self.interval)}
        return json.dumps(
            interval
            | {
                "dag_id": self.dag_id,
                "task_id": self.task_id,
                "map_index": self.map_index,
                "run_id": self.run_id,
                "stream": self.stream,
                "recorded_at": self.recorded_at,
                "partitions": {
                    str(p): [r.processed, r.dead_lettered, r.lag, r.high_watermark]
                    for p, r in sorted(self.partitions.items())
                },
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, value: bytes) -> RunEntry:
        """An entry from a history message's value.

        :raises InvalidArgumentError: not an entry.
        """
        try:
            data: dict[str, Any] = json.loads(value)
            partitions = {int(p): PartitionRun(*(int(n) for n in row)) for p, row in data["partitions"].items()}
            interval = data.get("interval")
            return cls(
                dag_id=str(data["dag_id"]),
                task_id=str(data["task_id"]),
                run_id=str(data["run_id"]),
                stream=str(data["stream"]),
                partitions=partitions,
                map_index=int(data.get("map_index", -1)),
                recorded_at=int(data["recorded_at"]),
                interval=None if interval is None else (int(interval[0]), int(interval[1])),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"not a run history entry ({type(exc).__name__}: {exc})") from None


def record_run(client: LiftbridgeClient, entry: RunEntry, *, stream: str = HISTORY_STREAM) -> None:
    """Append ``entry`` to the history (creating the stream, retention-limited, if missing) and
    wait for the leader's ack.

    :raises LiftbridgeError: the stream could not be created or the entry was not acknowledged.
    """
    key = f"{entry.dag_id}\x1f{entry.task_id}\x1f{entry.map_index}".encode()
    limits = {"retention_max_messages": HISTORY_MAX_MESSAGES, "retention_max_age": HISTORY_MAX_AGE}
    publish_entry(client, stream, key, entry.to_json(), **limits)


def read_history(client: LiftbridgeClient, *, limit: int, stream: str = HISTORY_STREAM) -> list[RunEntry]:
    """The newest ``limit`` history entries, oldest first (``[]`` while there is none). Messages
    that are not entries are skipped.

    :raises LiftbridgeError: the history could not be read.
    """
    found = list(tail_entries(client, stream, limit, RunEntry.from_json))
    found.sort(key=lambda e: e.recorded_at)
    return found[-limit:]
