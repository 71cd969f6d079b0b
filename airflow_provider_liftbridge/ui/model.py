"""What the Liftbridge view shows, gathered with the client only (no Airflow, no FastAPI here):
the cluster, the pipelines (from the registry and their cursors), dead letters and messages.

Every function takes a :class:`~airflow_provider_liftbridge.client.LiftbridgeClient`, reads, and
returns JSON-safe dicts. Nothing here writes to the cluster: a paused partition is not resumed
(its messages are not browsable until something resumes it), no cursor is set.

The functions block (they are synchronous client calls): the API runs them off the event loop.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any
from urllib.parse import quote

from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    Message,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionInfo,
    PartitionPausedError,
)
from airflow_provider_liftbridge.client.reading import (
    DEAD_LETTER_HEADERS,
    NO_PLAN,
    Interval,
    PipelineEntry,
    latest_reading,
    plan_cursor_ids,
    plan_start_cursor_id,
    read_pipelines,
    run_tag,
)
from airflow_provider_liftbridge.client.reading.dead_letter import (
    ERROR_MESSAGE_HEADER,
    ERROR_TYPE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_STREAM_HEADER,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

__all__ = [
    "MAX_MESSAGES",
    "MAX_VALUE_BYTES",
    "browse",
    "cluster",
    "dead_letter_streams",
    "dead_letters",
    "pipelines",
    "real_headers",
    "render_message",
    "render_time",
]

#: At most this many messages per browse or per dead-letter stream.
MAX_MESSAGES = 200
#: Values (and keys, headers) are shown up to this many bytes; longer ones are cut and flagged.
MAX_VALUE_BYTES = 16 * 1024
#: Message timestamps are int64 nanoseconds: they end in 2262.
_MAX_TIMESTAMP_S = (1 << 63) / 1e9


# -- rendering ---------------------------------------------------------------------------------
def render_time(nanos: int) -> str | None:
    """An epoch-nanoseconds timestamp as ISO 8601 UTC (``None`` for 0 or less: unknown)."""
    if nanos <= 0:
        return None
    return dt.datetime.fromtimestamp(nanos / 1e9, dt.UTC).isoformat(timespec="milliseconds")


_iso = render_time


def partition_summary(p: PartitionInfo) -> dict[str, Any]:
    """What the metadata says of a partition: leader, replicas, ISR, offsets and flags."""
    return {
        "id": p.id,
        "leader": p.leader,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
        "high_watermark": p.high_watermark,
        "newest_offset": p.newest_offset,
        "paused": p.paused,
        "readonly": p.readonly,
    }


def render_bytes(data: bytes | None) -> dict[str, Any] | None:
    """``data`` for a page: ``{"format": "json" | "text" | "hex", "value", "size", "truncated"}``.

    JSON when the whole value parses (and fits), else UTF-8 text, else hex; cut at
    :data:`MAX_VALUE_BYTES`.
    """
    if data is None:
        return None
    size = len(data)
    shown = data[:MAX_VALUE_BYTES]
    truncated = size > MAX_VALUE_BYTES
    if not truncated:
        try:
            return {"format": "json", "value": json.loads(shown), "size": size, "truncated": False}
        except (UnicodeDecodeError, ValueError):
            pass
    for cut in range(4):  # a cut may split a multi-byte character: drop up to 3 bytes
        try:
            text = shown[: len(shown) - cut].decode("utf-8")
        except UnicodeDecodeError:
            if not truncated:
                break
            continue
        if text.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in text):
            return {"format": "text", "value": text, "size": size, "truncated": truncated}
        break
    return {"format": "hex", "value": shown.hex(), "size": size, "truncated": truncated}


def _header_text(headers: Mapping[str, bytes], name: str) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("utf-8", "replace")


def real_headers(message: Message) -> Mapping[str, bytes]:
    """The headers the publisher gave: without the ``subject`` and ``reply`` headers Liftbridge
    adds to every message (they repeat the message's subject and reply subject)."""
    own = {"subject": message.subject.encode(), "reply": message.reply_subject.encode()}
    return {name: value for name, value in message.headers.items() if own.get(name) != value}


def render_message(message: Message) -> dict[str, Any]:
    """A message for a page: offset, time, key, the publisher's headers (:func:`real_headers`) and
    value (see :func:`render_bytes`)."""
    return {
        "stream": message.stream,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": _iso(message.timestamp),
        "key": render_bytes(message.key),
        "headers": {name: render_bytes(value) for name, value in sorted(real_headers(message).items())},
        "value": render_bytes(message.value),
    }


def _check_count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MESSAGES:
        raise LiftbridgeArgumentError(f"{name} must be a whole number from 1 to {MAX_MESSAGES}, got {value!r}")
    return value


# -- cluster -----------------------------------------------------------------------------------
def cluster(client: LiftbridgeClient) -> dict[str, Any]:
    """Brokers, and every stream (the internal ``__cursors`` too) with its partitions: leader,
    replicas, ISR, high watermark, newest offset, paused and read-only flags. One metadata call.

    :raises LiftbridgeError: the cluster did not answer.
    """
    metadata = client.fetch_metadata()
    return {
        "brokers": [
            {
                "id": b.id,
                "host": b.host,
                "port": b.port,
                "partitions": b.partition_count,
                "leaders": b.leader_count,
            }
            for b in sorted(metadata.brokers, key=lambda b: b.id)
        ],
        "streams": [
            {
                "name": name,
                "subject": info.subject,
                "created": _iso(info.creation_timestamp),
                "partitions": [partition_summary(p) for _, p in sorted(info.partitions.items())],
            }
            for name, info in sorted(metadata.streams.items())
        ],
    }


# -- pipelines ---------------------------------------------------------------------------------
def _first_message(client: LiftbridgeClient, stream: str, partition: int, start: int, stop: int) -> Message | None:
    """The first message from ``start`` to ``stop`` (inclusive): one bounded read that ends after
    one message (``None``: none there any more, e.g. compacted or expired, or the partition is
    paused)."""
    messages = client.subscribe(stream, partition=partition, start_at=start, stop_at=stop)
    try:
        return next(messages, None)
    except LiftbridgeError:  # paused (the view does not resume it), or gone meanwhile
        return None
    finally:
        messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription


def _message_at(client: LiftbridgeClient, stream: str, partition: int, offset: int) -> Message | None:
    """The message at ``offset`` (``None``: gone, e.g. compacted, or the partition is paused)."""
    first = _first_message(client, stream, partition, offset, offset)
    return first if first is not None and first.offset == offset else None


def _lag_age(client: LiftbridgeClient, stream: str, partition: int, read_to: int, hw: int, now_ns: int) -> float | None:
    """Seconds since the oldest unread message (after ``read_to``, up to ``hw``) was stamped: 0.0
    when nothing is unread, ``None`` when it cannot be read (paused, or gone from the log)."""
    if hw <= read_to:
        return 0.0
    oldest = _first_message(client, stream, partition, max(read_to + 1, 0), hw)
    if oldest is None or oldest.timestamp <= 0:
        return None
    # A clock behind the broker's would give a negative age: the message is new, not from the future.
    return max(0.0, (now_ns - oldest.timestamp) / 1e9)


def _position_rows(client: LiftbridgeClient, entry: PipelineEntry, partitions: list[int]) -> list[dict[str, Any]]:
    """Per partition of a pipeline reading by position: its position cursor, and its plan (the
    plan cursors)."""
    end_cursor, tag_cursor = plan_cursor_ids(entry.position_cursor, entry.plan_key)
    start_cursor = plan_start_cursor_id(entry.position_cursor, entry.plan_key)
    latest_tag = run_tag(entry.run_id)
    rows = []
    for p in partitions:
        position = client.fetch_cursor(entry.position_cursor, entry.stream, p)
        end = client.fetch_cursor(end_cursor, entry.stream, p)
        plan: dict[str, Any] | None = None
        if end != NO_PLAN:
            tag = client.fetch_cursor(tag_cursor, entry.stream, p)
            start = client.fetch_cursor(start_cursor, entry.stream, p)
            plan = {
                "start": start if start >= 0 else None,
                "end": end,  # exclusive
                "run_id": entry.run_id if tag == latest_tag else None,
                "finished": position >= end - 1,
            }
        rows.append({"partition": p, "position": position, "read_to": position, "plan": plan})
    return rows


def _interval_rows(
    client: LiftbridgeClient, entry: PipelineEntry, interval: Interval, partitions: list[int]
) -> tuple[list[dict[str, Any]], bool]:
    """Per partition of a pipeline reading by interval: the progress cursor of the latest reading
    of its latest interval, and the interval's offsets as its run planned them (the plan); and
    whether that reading finished. No position cursor is read: there is none."""
    if not partitions:
        return [], False
    progress, finished = latest_reading(
        client, entry.stream, entry.position_cursor, entry.plan_key, interval, min(entry.partitions or partitions)
    )
    offsets = {p: (first, end) for p, first, end in entry.interval_offsets}
    rows = []
    for p in partitions:
        position = client.fetch_cursor(progress, entry.stream, p)
        first, end = offsets.get(p, (0, 0))
        rows.append(
            {
                "partition": p,
                "position": position,
                # Read up to here: the progress, or just before the interval while none was read.
                "read_to": max(position, first - 1) if p in offsets else position,
                "plan": {
                    "start": first,
                    "end": end,  # exclusive
                    "run_id": entry.run_id,
                    "finished": finished or position >= end - 1,
                }
                if p in offsets
                else None,
            }
        )
    return rows, finished


def _pipeline(client: LiftbridgeClient, entry: PipelineEntry, hws: Mapping[int, int]) -> dict[str, Any]:
    """One pipeline: its task, links, and per partition position, HW, lag and plan (reading by
    interval: the progress in its latest interval and that interval's offsets)."""
    partitions = sorted(hws) if entry.group_id else sorted(p for p in entry.partitions if p in hws)
    interval: dict[str, Any] | None = None
    error = None
    if entry.mode == "DataInterval":
        try:
            span = Interval.from_ms(entry.interval_start or 0, entry.interval_end or 0)
        except InvalidArgumentError as exc:
            rows, error = [], f"its registry entry has no usable interval ({exc})"
        else:
            rows, finished = _interval_rows(client, entry, span, partitions)
            interval = span.to_dict() | {"finished": finished}
    else:
        rows = _position_rows(client, entry, partitions)
    now_ns = time.time_ns()
    for row in rows:
        p, read_to = row["partition"], row.pop("read_to")
        committed = _message_at(client, entry.stream, p, row["position"]) if row["position"] >= 0 else None
        row["high_watermark"] = hw = hws[p]
        # Committed messages after what was read (all of them when nothing was read yet); reading by
        # interval, once the interval is read: the messages after its end.
        row["lag"] = max(0, hw - read_to) if read_to >= 0 else hw + 1
        row["last_commit_time"] = _iso(committed.timestamp) if committed is not None else None
        row["lag_age_s"] = _lag_age(client, entry.stream, p, read_to, hw, now_ns)
    ages = [row["lag_age_s"] for row in rows]
    # Relative to Airflow's base URL (``[api] base_url``): the page puts its own prefix before them.
    dag_link = f"dags/{quote(entry.dag_id, safe='')}"
    task_link = f"{dag_link}/tasks/{quote(entry.task_id, safe='')}"
    return {
        "dag_id": entry.dag_id,
        "task_id": entry.task_id,
        "map_index": entry.map_index,
        "operator": entry.operator,
        "stream": entry.stream,
        "mode": entry.mode,
        "interval": interval,
        "cursor_id": entry.cursor_id,
        "group_id": entry.group_id,
        "position_cursor": entry.position_cursor,
        "dead_letter_stream": entry.dead_letter_stream,
        "last_run_id": entry.run_id,
        "recorded_at": _iso(entry.recorded_at * 1_000_000),
        "links": {"dag": dag_link, "task": task_link},
        "lag": sum(row["lag"] for row in rows),
        # The oldest unread message of all partitions (None: one of them could not be read).
        "lag_age_s": None if None in ages else max(ages, default=0.0),
        "partitions": rows,
        "error": error,
    }


def dead_letter_streams(client: LiftbridgeClient) -> list[str]:
    """The dead-letter streams the registered pipelines send to."""
    return sorted({e.dead_letter_stream for e in read_pipelines(client) if e.dead_letter_stream})


def pipelines(client: LiftbridgeClient) -> dict[str, Any]:
    """Every reading task recorded in the pipeline registry (``client.reading.registry``) with
    its consumer group if any, and per partition: position, high watermark, lag, the age of the
    oldest unread message (``lag_age_s``, seconds; one bounded read of one message per partition
    with a lag), the time of the last committed message, the current plan. A task reading by
    interval has ``mode`` = ``"DataInterval"`` and its latest interval (``start``, ``end``, whether
    it is read); its position
    is its progress in that interval, its plan that interval's offsets. A pipeline whose stream is
    gone is listed with an ``error``.

    :raises LiftbridgeError: the cluster did not answer, or cursors are disabled.
    """
    entries = read_pipelines(client)
    streams = sorted({e.stream for e in entries})
    metadata = client.fetch_metadata(streams) if streams else None
    out = []
    for entry in entries:
        info = metadata.streams.get(entry.stream) if metadata is not None else None
        if info is None:
            row = _pipeline(client, entry, {}) | {"error": f"stream {entry.stream!r} does not exist (any more)"}
        else:
            row = _pipeline(client, entry, {p: part.high_watermark for p, part in info.partitions.items()})
        out.append(row)
    groups = sorted({e.group_id for e in entries if e.group_id})
    return {"pipelines": out, "groups": groups}


# -- reading messages --------------------------------------------------------------------------
def _hws(client: LiftbridgeClient, stream: str) -> dict[int, int]:
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist: check the name on the cluster page")
    return {p: part.high_watermark for p, part in info.partitions.items()}


def _read(client: LiftbridgeClient, stream: str, partition: int, start: Any, stop: int, count: int) -> list[Message]:
    """Up to ``count`` messages from ``start`` to ``stop`` (inclusive), never resuming a pause.

    :raises PartitionPausedError: the partition is paused (the view does not resume it).
    """
    messages: Iterator[Message] = client.subscribe(stream, partition=partition, start_at=start, stop_at=stop)
    try:
        return list(islice(messages, count))
    finally:
        messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription


def browse(
    client: LiftbridgeClient,
    stream: str,
    partition: int,
    *,
    last: int | None = None,
    from_offset: int | None = None,
    from_time: dt.datetime | None = None,
    limit: int = 20,
) -> dict[str, Any]:
    """Messages of one partition: the ``last`` N (default: the last ``limit``), or up to ``limit``
    from an offset or from a time (the first message at or after it). At most
    :data:`MAX_MESSAGES` messages, each value cut at :data:`MAX_VALUE_BYTES`.

    :raises LiftbridgeArgumentError: more than one of ``last``/``from_offset``/``from_time``, a bad count.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: no such stream or partition.
    :raises PartitionPausedError: the partition is paused.
    """
    given = [n for n, v in (("last", last), ("from_offset", from_offset), ("from_time", from_time)) if v is not None]
    if len(given) > 1:
        raise LiftbridgeArgumentError(f"give one of last, from_offset and from_time, not {' and '.join(given)}")
    limit = _check_count(limit, "limit")
    hws = _hws(client, stream)
    if partition not in hws:
        raise NoSuchPartitionError(f"stream {stream!r} has no partition {partition} (it has {sorted(hws)})")
    hw = hws[partition]
    found: list[Message] = []
    if hw >= 0:
        if from_offset is not None:
            if from_offset < 0:
                raise LiftbridgeArgumentError(f"from_offset must not be negative, got {from_offset}")
            if from_offset <= hw:
                found = _read(client, stream, partition, from_offset, min(hw, from_offset + limit - 1), limit)
        elif from_time is not None:
            if from_time.tzinfo is None:
                from_time = from_time.replace(tzinfo=dt.UTC)
            if not 0 <= from_time.timestamp() < _MAX_TIMESTAMP_S:
                raise LiftbridgeArgumentError(
                    f"from_time {from_time.isoformat()} is outside what message timestamps hold (1970 to 2262)"
                )
            try:
                found = _read(client, stream, partition, from_time, hw, limit)
            except InvalidArgumentError:  # the server refuses a time after the last message: none there
                found = []
        else:
            count = _check_count(last if last is not None else limit, "last")
            found = _read(client, stream, partition, max(0, hw - count + 1), hw, count)
    return {
        "stream": stream,
        "partition": partition,
        "high_watermark": hw,
        "messages": [render_message(m) for m in found],
    }


def dead_letters(client: LiftbridgeClient, streams: list[str], *, limit: int = 20) -> dict[str, Any]:
    """Per dead-letter stream: how many letters it holds, and the newest ``limit`` of them (of
    all partitions) with the error type and text and where each came from.

    :raises LiftbridgeError: the cluster did not answer.
    """
    limit = _check_count(limit, "limit")
    out = []
    for stream in sorted(set(streams)):
        try:
            hws = _hws(client, stream)
        except LiftbridgeError as exc:
            out.append({"stream": stream, "count": 0, "letters": [], "error": str(exc)})
            continue
        letters: list[Message] = []
        error = None
        for partition, hw in sorted(hws.items()):
            if hw < 0:
                continue
            try:
                letters += _read(client, stream, partition, max(0, hw - limit + 1), hw, limit)
            except PartitionPausedError as exc:
                error = f"partition {partition}: {exc}"
        letters.sort(key=lambda m: m.timestamp, reverse=True)
        out.append(
            {
                "stream": stream,
                # Offsets 0..HW per partition: the letters ever committed (retention may have removed old ones).
                "count": sum(hw + 1 for hw in hws.values()),
                "letters": [_letter(m) for m in letters[:limit]],
                "error": error,
            }
        )
    return {"streams": out}


def _letter(message: Message) -> dict[str, Any]:
    headers = message.headers
    source_partition = _header_text(headers, SOURCE_PARTITION_HEADER)
    source_offset = _header_text(headers, SOURCE_OFFSET_HEADER)
    rendered = render_message(message)
    rendered["headers"] = {k: v for k, v in rendered["headers"].items() if k not in DEAD_LETTER_HEADERS}
    return rendered | {
        "error_type": _header_text(headers, ERROR_TYPE_HEADER),
        "error": _header_text(headers, ERROR_MESSAGE_HEADER),
        "source_stream": _header_text(headers, SOURCE_STREAM_HEADER),
        "source_partition": int(source_partition) if source_partition and source_partition.isdigit() else None,
        "source_offset": int(source_offset) if source_offset and source_offset.isdigit() else None,
    }
