"""The pipeline registry: where the reading operators say, on the server, which task reads which
stream with which position cursor, so that a viewer (the Airflow UI view, a script) can find
every pipeline without Airflow's database.

Liftbridge has no call that lists cursors (FetchCursor needs the cursor id, the stream and the
partition), nor one that lists consumer groups (FetchMetadata answers only for groups named in
the request). The position and plan cursors alone therefore cannot be found: each reading task
records, once per run when it plans, one small JSON message in the registry stream
(:data:`REGISTRY_STREAM`, one partition, compacted) keyed by (position cursor, stream, plan key).
From an entry a reader knows every cursor id (:mod:`.plan`) and can fetch positions and plans.
Each entry names the task's reading mode (:data:`MODES`, as the DAG writes it: ``read=SinceLastRun(...)``,
...). A task reading a data interval has no position cursor: its entry names the prefix of its
per-interval progress cursors (:mod:`.interval`) and the interval its run planned.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ..errors import InvalidArgumentError, StreamExistsError
from ..stream_options import BOOKKEEPING_SEGMENT_BYTES
from ..sync_client import LiftbridgeClient
from ..types import AckPolicy

_Entry = TypeVar("_Entry")

__all__ = ["MODES", "REGISTRY_STREAM", "PipelineEntry", "read_pipelines", "record_pipeline"]

#: The registry stream (and its subject).
REGISTRY_STREAM = "airflow-liftbridge-pipelines"
#: At most this many registry messages are read (the newest); compaction keeps one per key.
MAX_REGISTRY_MESSAGES = 10_000
#: The reading modes an entry names: the names of the values a DAG gives as ``read=``.
MODES = ("SinceLastRun", "ConsumerGroup", "DataInterval")


@dataclass(frozen=True, slots=True)
class PipelineEntry:
    """One reading task as recorded in the registry.

    :param stream: the stream it reads.
    :param position_cursor: the cursor id holding its positions (``__group:<group>`` for a group);
        reading by interval: the prefix of its progress cursors (:func:`.interval.interval_cursor_ids`).
    :param plan_key: its plan key (``dag_id/task_id[/map_index]``).
    :param dag_id: / :param task_id: / :param map_index: the task (``-1``: not mapped).
    :param run_id: the run that made its latest plan.
    :param partitions: the partitions that plan covered.
    :param cursor_id: the user's cursor id, or ``None`` in a consumer group.
    :param group_id: the consumer group, or ``None``.
    :param operator: the operator class name.
    :param dead_letter_stream: where it sends what it cannot process, if anywhere.
    :param recorded_at: when it was recorded (milliseconds since the epoch).
    :param mode: the reading mode, one of :data:`MODES` (an entry of an earlier version, without
        one, loads as ``"DataInterval"`` if its ``read_by`` said ``"interval"``, else as
        ``"ConsumerGroup"`` with a group, else ``"SinceLastRun"``).
    :param interval_start: / :param interval_end: ``DataInterval``: the interval the run
        planned, ``[start, end)`` in milliseconds since the epoch.
    :param interval_offsets: ``DataInterval``: per partition ``(partition, first offset,
        exclusive end)`` of that interval.
    """

    stream: str
    position_cursor: str
    plan_key: str
    dag_id: str
    task_id: str
    run_id: str
    partitions: tuple[int, ...]
    map_index: int = -1
    cursor_id: str | None = None
    group_id: str | None = None
    operator: str = ""
    dead_letter_stream: str | None = None
    recorded_at: int = field(default_factory=lambda: int(time.time() * 1000))
    mode: str = "SinceLastRun"
    interval_start: int | None = None
    interval_end: int | None = None
    interval_offsets: tuple[tuple[int, int, int], ...] = ()

    @property
    def key(self) -> bytes:
        """The registry key: one entry per (position cursor, stream, plan key)."""
        return f"{self.position_cursor}\x1f{self.stream}\x1f{self.plan_key}".encode()

    def to_json(self) -> bytes:
        """The registry message's value."""
        return json.dumps(asdict(self) | {"partitions": list(self.partitions)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, value: bytes) -> PipelineEntry:
        """An entry from a registry message's value.

        :raises InvalidArgumentError: not an entry (the message says what was wrong).
        """
        try:
            data: dict[str, Any] = json.loads(value)
            known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
            if "mode" not in known:  # written before the modes had names
                by_interval = data.get("read_by") == "interval"
                known["mode"] = MODES[2] if by_interval else MODES[1] if data.get("group_id") else MODES[0]
            known["partitions"] = tuple(int(p) for p in known.get("partitions", ()))
            known["interval_offsets"] = tuple(
                (int(p), int(first), int(end)) for p, first, end in known.get("interval_offsets", ())
            )
            return cls(**known)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidArgumentError(f"not a pipeline registry entry ({type(exc).__name__}: {exc})") from None


def record_pipeline(client: LiftbridgeClient, entry: PipelineEntry, *, stream: str = REGISTRY_STREAM) -> None:
    """Publish ``entry`` to the registry (creating the registry stream, compacted, if missing) and
    wait for the leader's ack.

    :raises LiftbridgeError: the stream could not be created or the entry was not acknowledged.
    """
    publish_entry(client, stream, entry.key, entry.to_json(), compact_enabled=True)


def publish_entry(client: LiftbridgeClient, stream: str, key: bytes, value: bytes, **options: Any) -> None:
    """Publish one bookkeeping entry to ``stream`` (created with ``options`` and segments of
    :data:`BOOKKEEPING_SEGMENT_BYTES` if missing; another task creating it meanwhile is fine) and
    wait for the leader's ack. The registry and the run history (:mod:`.history`) keep their
    entries so.

    :raises LiftbridgeError: the stream could not be created or the entry was not acknowledged.
    """
    if stream not in client.fetch_metadata([stream]).streams:
        try:
            client.create_stream(stream, stream, **{"segment_max_bytes": BOOKKEEPING_SEGMENT_BYTES, **options})
        except StreamExistsError:
            pass  # another task created it meanwhile
    client.publish(stream, value, key=key, ack_policy=AckPolicy.LEADER)


def read_pipelines(
    client: LiftbridgeClient, *, stream: str = REGISTRY_STREAM, limit: int = MAX_REGISTRY_MESSAGES
) -> list[PipelineEntry]:
    """The registry's entries, the newest per key, sorted by DAG, task and stream (``[]`` when no
    reading task recorded one yet). Messages that are not entries are skipped.

    :raises LiftbridgeError: the registry could not be read.
    """
    newest: dict[bytes, PipelineEntry] = {}
    for entry in tail_entries(client, stream, limit, PipelineEntry.from_json):
        newest[entry.key] = entry
    return sorted(newest.values(), key=lambda e: (e.dag_id, e.task_id, e.map_index, e.stream))


def tail_entries(
    client: LiftbridgeClient, stream: str, limit: int, parse: Callable[[bytes], _Entry]
) -> Iterator[_Entry]:
    """The entries among the last ``limit`` committed messages of each partition of a bookkeeping
    stream (the registry, the run history), parsed by ``parse``; nothing when the stream does not
    exist. Messages ``parse`` refuses (:class:`InvalidArgumentError`) are skipped.

    :raises LiftbridgeError: the stream could not be read.
    """
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None:
        return
    for partition in sorted(info.partitions):
        hw = client.fetch_partition_metadata(stream, partition).high_watermark
        if hw < 0:
            continue
        messages = client.subscribe(stream, partition=partition, start_at=max(0, hw - limit + 1), stop_at=hw)
        try:
            for message in messages:
                try:
                    yield parse(message.value)
                except InvalidArgumentError:
                    continue
        finally:
            messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription
