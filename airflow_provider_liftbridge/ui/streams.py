"""The view's Streams tab, with the client only (no Airflow, no FastAPI here): every stream's
size and settings as far as Liftbridge tells them, sorted and paged on the server so a cluster of
thousands of streams answers one page at a time (docs/ui.md, "Streams").

What Liftbridge gives (``FetchMetadata``, ``StreamMetadata`` and ``PartitionMetadata`` in
``api.proto``): per stream its subject, creation time and partitions; per partition its leader,
replicas, ISR, high watermark, newest offset, paused and read-only flags and the times the first
retained and the latest message were received. It gives no size in bytes, no oldest offset and
none of the settings a stream was created with (retention, segments, compaction, auto-pause,
min ISR, optimistic concurrency, encryption): no call returns them. The oldest offset is found by
reading the first retained message of each partition on the page shown (one bounded read each),
never of the whole cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    LiftbridgeError,
    PartitionInfo,
    StreamInfo,
)
from airflow_provider_liftbridge.client.reading.seek import oldest_retained

from .model import partition_summary, render_time
from .rates import SAMPLER

__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "SORTS", "NOT_RETURNED", "page"]

#: Streams per page unless asked otherwise, and at most.
DEFAULT_PAGE = 50
MAX_PAGE = 500
#: Partitions whose oldest offset is read at once (one bounded one-message read each).
_READERS = 8
#: The creation settings of ``CreateStreamRequest`` that no call returns (said on the page).
NOT_RETURNED = (
    "retention (max bytes, messages, age)",
    "segment size and age",
    "cleaner interval",
    "compaction",
    "auto-pause",
    "min ISR",
    "optimistic concurrency control",
    "encryption",
    "the size in bytes",
)


def _committed(p: PartitionInfo) -> int:
    """Messages ever committed to a partition: offsets 0 to its high watermark."""
    return max(p.high_watermark + 1, 0)


def _summary(info: StreamInfo) -> dict[str, Any]:
    parts = list(info.partitions.values())
    firsts = [p.first_message_timestamp for p in parts if p.first_message_timestamp > 0]
    latest = max((p.latest_message_timestamp for p in parts), default=0)
    return {
        "name": info.name,
        "subject": info.subject,
        "created": render_time(info.creation_timestamp),
        "partitions": len(parts),
        "replication": max((len(p.replicas) for p in parts), default=0),
        "committed": sum(_committed(p) for p in parts),
        "newest_offset": max((p.newest_offset for p in parts), default=-1),
        "first_message": render_time(min(firsts)) if firsts else None,
        "latest_message": render_time(latest),
        "paused": sum(p.paused for p in parts),
        "readonly": sum(p.readonly for p in parts),
        "internal": info.name.startswith("__"),
    }


#: The sortable columns and how each sorts (ties by name).
SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda s: s["name"],
    "subject": lambda s: s["subject"],
    "created": lambda s: s["created"] or "",
    "partitions": lambda s: s["partitions"],
    "replication": lambda s: s["replication"],
    "committed": lambda s: s["committed"],
    "newest_offset": lambda s: s["newest_offset"],
    "latest_message": lambda s: s["latest_message"] or "",
    "paused": lambda s: s["paused"] + s["readonly"],
    "rate": lambda s: -1.0 if s["rate"] is None else s["rate"],
}


def _oldest(client: LiftbridgeClient, p: PartitionInfo) -> tuple[int | None, str | None]:
    """The offset of a partition's first retained message (``None`` and why when it cannot be
    read: the partition is paused, which the view does not undo, or its log is empty)."""
    if p.high_watermark < 0:
        return None, "empty"
    if p.paused:
        return None, "paused (the view does not resume it)"
    try:
        # Not a subscription from EARLIEST: on a log that retention emptied it would wait for the
        # next message (Liftbridge's start there is offset 0), and the page with it. This one
        # takes the client's timeout there.
        first = oldest_retained(client, p.stream, p.id, p.high_watermark)
    except LiftbridgeError as exc:
        return None, str(exc)
    return (first, None) if first <= p.high_watermark else (None, "nothing retained")


def _partition(p: PartitionInfo, oldest: tuple[int | None, str | None]) -> dict[str, Any]:
    first, why = oldest
    return partition_summary(p) | {
        "oldest_offset": first,
        "oldest_unknown": why if first is None and why != "empty" else None,
        # Offsets from the oldest retained to the high watermark: the messages retained, at most
        # (compaction leaves gaps: Liftbridge does not say how many are left in them).
        "retained": (p.high_watermark - first + 1) if first is not None else (0 if p.high_watermark < 0 else None),
        "committed": _committed(p),
        "first_message": render_time(p.first_message_timestamp),
        "latest_message": render_time(p.latest_message_timestamp),
    }


def page(
    client: LiftbridgeClient,
    *,
    sort: str = "name",
    descending: bool = False,
    offset: int = 0,
    limit: int = DEFAULT_PAGE,
    text: str | None = None,
) -> dict[str, Any]:
    """One page of the cluster's streams (the internal ``__cursors`` too), those whose name or
    subject contains ``text`` (any case), sorted by ``sort`` (a key of :data:`SORTS`), from
    ``offset``, at most ``limit``; each with its partitions and, for them, the oldest retained
    offset, and its message rate (:mod:`.rates`, from this metadata and earlier answers'). One
    metadata call, then one bounded read per partition of the page (``_READERS`` at a time).

    :raises ValueError: an unknown ``sort``, a negative ``offset``, ``limit`` outside 1 to
        :data:`MAX_PAGE` (the API checks them first and answers 400).
    :raises LiftbridgeError: the cluster did not answer.
    """
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}; got {sort!r}")
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"offset must be 0 or more and limit 1 to {MAX_PAGE}; got {offset}, {limit}")
    metadata = client.fetch_metadata()
    cluster = ",".join(sorted(f"{b.id}@{b.address}" for b in metadata.brokers))
    rates = SAMPLER.rates(cluster, metadata.streams)  # from this metadata: no call of its own
    rows = [_summary(info) | rates[info.name] for info in metadata.streams.values()]
    wanted = (text or "").strip().lower()
    matched = [s for s in rows if not wanted or wanted in s["name"].lower() or wanted in s["subject"].lower()]
    matched.sort(key=lambda s: s["name"])
    matched.sort(key=SORTS[sort], reverse=descending)  # stable: ties stay by name
    shown = matched[offset : offset + limit]
    parts = [p for s in shown for _, p in sorted(metadata.streams[s["name"]].partitions.items())]
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        oldest = dict(
            zip(((p.stream, p.id) for p in parts), pool.map(lambda p: _oldest(client, p), parts), strict=True)
        )
    for s in shown:
        info = metadata.streams[s["name"]]
        s["partition_list"] = [_partition(p, oldest[(p.stream, p.id)]) for _, p in sorted(info.partitions.items())]
        known = [p["retained"] for p in s["partition_list"]]
        s["retained"] = None if None in known else sum(known)
    return {
        "total": len(rows),
        "matched": len(matched),
        "offset": offset,
        "limit": limit,
        "sort": sort,
        "descending": descending,
        "brokers": len(metadata.brokers),
        "not_returned": list(NOT_RETURNED),
        "streams": shown,
    }
