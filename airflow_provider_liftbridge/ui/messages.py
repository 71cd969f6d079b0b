"""The message browser's search (docs/ui.md, "The message browser"), with the client only (no
Airflow, no FastAPI here): find messages of a stream by key, value, JSON path or header, over one
partition or all of them merged by time, newest or oldest first, from any offset, time or page
position; and one message whole.

A search is planned (:func:`plan`: the input checked, the stream's partitions and where each is
read from), then run (:meth:`Search.events`: a generator of JSON-safe events the API streams as
NDJSON). Reading stops when the page is full, when every partition is read to its end, or at the
bounds: :data:`MAX_SCAN_BYTES` examined or :data:`MAX_SCAN_SECONDS` spent; the last event says
which, and where the next page (either way) starts.

Every bad input raises :class:`SearchInputError`, naming the field and what to type.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    LiftbridgeClient,
    Message,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
)

from .model import real_headers, render_message, render_time
from .search_input import (
    JsonPath,
    SearchInputError,
    blank,
    header_filter,
    parse_count,
    parse_json_path,
    parse_key,
    parse_offset,
    parse_positions,
    parse_time,
    positions_text,
)

__all__ = [
    "MAX_PAGE",
    "MAX_SCAN_BYTES",
    "MAX_SCAN_SECONDS",
    "MAX_VIEW_BYTES",
    "Search",
    "message_at",
    "plan",
]

#: At most this many messages per page.
MAX_PAGE = 500
#: A search examines at most this many bytes of messages (keys, values, headers) per request; it
#: reads ahead of them by up to ``_CHUNK_BYTES`` (4 MiB) per partition.
MAX_SCAN_BYTES = 64 * 1024 * 1024
#: A search reads for at most this long per request (checked between messages).
MAX_SCAN_SECONDS = 20.0
#: The message view shows (and hex-dumps) up to this many bytes of a value; the download has it all.
MAX_VIEW_BYTES = 1024 * 1024
#: A progress event at most this often.
PROGRESS_EVERY_S = 0.25
#: One read of a partition: at most this many messages and (about) this many bytes.
_CHUNK_MESSAGES = (50, 1000)
_CHUNK_BYTES = 4 * 1024 * 1024


# -- one partition, read in chunks ---------------------------------------------------------------
def _size(message: Message) -> int:
    return len(message.value) + len(message.key or b"") + sum(len(k) + len(v) for k, v in message.headers.items())


class _Reader:
    """One partition read from ``next`` towards its end (``hw`` forward, offset 0 backward), in
    chunks; ``resume`` is the next offset not yet taken (the next page's start)."""

    def __init__(self, client: LiftbridgeClient, stream: str, partition: int, start: int, hw: int, forward: bool):
        self.client, self.stream, self.partition, self.hw, self.forward = client, stream, partition, hw, forward
        self.next = self.resume = start
        self.buffer: deque[Message] = deque()
        self.chunk = _CHUNK_MESSAGES[0]

    @property
    def exhausted(self) -> bool:
        return self.next > self.hw if self.forward else self.next < 0

    def fill(self) -> int:
        """Read the next chunk into the buffer; return the bytes read. (Nothing when exhausted.)"""
        if self.buffer or self.exhausted:
            return 0
        lo, hi = (
            (self.next, min(self.hw, self.next + self.chunk - 1))
            if self.forward
            else (
                max(0, self.next - self.chunk + 1),
                self.next,
            )
        )
        got: list[Message] = []
        read = 0
        # Stop at the high watermark, not at hi: when retention removed [lo, hi] a stop before the
        # oldest kept message is never reached (the dev server then waits for it); the first message
        # after hi ends the read instead.
        messages = self.client.subscribe(self.stream, partition=self.partition, start_at=lo, stop_at=self.hw)
        try:
            for message in islice(messages, hi - lo + 1):
                if message.offset > hi:  # the first offset >= lo lies after hi: none left in [lo, hi]
                    break
                got.append(message)
                read += _size(message)
                if self.forward and read >= _CHUNK_BYTES:
                    break  # a backward chunk is taken whole: it is reversed
        finally:
            messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription
        if self.forward:
            self.next = got[-1].offset + 1 if got and got[-1].offset < hi else hi + 1
        else:
            self.next = lo - 1
            got.reverse()
        self.buffer.extend(got)
        # The next chunk: twice as many messages, but about _CHUNK_BYTES at most at this size.
        per = read // len(got) if got else 1
        self.chunk = max(1, min(self.chunk * 2, _CHUNK_MESSAGES[1], _CHUNK_BYTES // max(per, 1)))
        return read

    def take(self) -> Message:
        message = self.buffer.popleft()
        self.resume = message.offset + 1 if self.forward else message.offset - 1
        return message

    def settle(self) -> None:
        """Nothing buffered: the reader resumes where it will read next."""
        if not self.buffer:
            self.resume = self.next


# -- the search --------------------------------------------------------------------------------
@dataclasses.dataclass
class Search:
    """A planned search (see :func:`plan`); :meth:`events` runs it."""

    client: LiftbridgeClient
    stream: str
    high_watermarks: dict[int, int]
    start: dict[int, int]
    forward: bool
    limit: int
    key: bytes | None = None
    value: bytes | None = None
    path: JsonPath | None = None
    header: tuple[str, bytes | None] | None = None
    max_bytes: int = MAX_SCAN_BYTES
    max_seconds: float = MAX_SCAN_SECONDS
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def matches(self, message: Message) -> bool:
        """Whether ``message`` passes every filter given."""
        if self.key is not None and message.key != self.key:
            return False
        if self.value is not None and self.value not in message.value:
            return False
        if self.header is not None:
            name, wanted = self.header
            found = real_headers(message).get(name)
            if found is None or (wanted is not None and found != wanted):
                return False
        if self.path is not None:
            try:
                document = json.loads(message.value)
            except ValueError:  # not JSON (UnicodeDecodeError is one): no path in it
                return False
            if not self.path.matches(document):
                return False
        return True

    def _other_way(self) -> dict[str, Any]:
        step = -1 if self.forward else 1
        back = {p: o + step for p, o in self.start.items()}
        done = all(o < 0 if self.forward else o > self.high_watermarks[p] for p, o in back.items())
        return {"scan": "backward" if self.forward else "forward", "at": positions_text(back), "done": done}

    def events(self) -> Iterator[dict[str, Any]]:
        """Run the search: a ``start`` event, ``message`` events in order (by time across
        partitions; ties by partition and offset), ``progress`` events, and an ``end`` event with
        why it ended (``page``: the page is full, ``end``: every partition was read, ``bytes`` or
        ``time``: a bound was reached) and where the next pages start.

        :raises LiftbridgeError: a read failed (the partition paused, or the stream deleted, meanwhile).
        """
        began = last_progress = self.clock()
        readers = {
            p: _Reader(self.client, self.stream, p, o, self.high_watermarks[p], self.forward)
            for p, o in sorted(self.start.items())
        }
        yield {
            "type": "start",
            "stream": self.stream,
            "scan": "forward" if self.forward else "backward",
            "partitions": sorted(readers),
            "skipped": {str(p): why for p, why in self.skipped.items()},
            "high_watermarks": {str(p): hw for p, hw in sorted(self.high_watermarks.items())},
            "at": positions_text(self.start),
            "bounds": {"bytes": self.max_bytes, "seconds": self.max_seconds, "page": self.limit},
        }
        scanned = read = matched = 0
        heads: list[tuple[tuple[int, int, int], int]] = []
        sign = 1 if self.forward else -1

        def push(reader: _Reader) -> None:
            """Refill ``reader`` if it is empty; put its head in the heap."""
            if not reader.buffer:
                reader.fill()
            reader.settle()
            if reader.buffer:
                head = reader.buffer[0]
                key = (sign * head.timestamp, sign * reader.partition, sign * head.offset)
                heapq.heappush(heads, (key, reader.partition))

        def progress(at: Message | None) -> dict[str, Any]:
            return {
                "type": "progress",
                "scanned": scanned,
                "bytes": read,
                "matched": matched,
                "seconds": round(self.clock() - began, 3),
                "partition": at.partition if at else None,
                "offset": at.offset if at else None,
                "time": render_time(at.timestamp) if at else None,
            }

        reason, current = "end", None
        for reader in readers.values():
            push(reader)
        while heads:
            if matched >= self.limit:
                reason = "page"
                break
            if read >= self.max_bytes:
                reason = "bytes"
                break
            if self.clock() - began >= self.max_seconds:
                reason = "time"
                break
            _, partition = heapq.heappop(heads)
            reader = readers[partition]
            current = reader.take()
            scanned += 1
            read += _size(current)
            if self.matches(current):
                matched += 1
                yield {"type": "message", "message": render_message(current)}
            push(reader)
            if self.clock() - last_progress >= PROGRESS_EVERY_S:
                last_progress = self.clock()
                yield progress(current)
        yield progress(current)
        onward = {p: r.resume for p, r in readers.items()}
        done = all(o > self.high_watermarks[p] if self.forward else o < 0 for p, o in onward.items())
        yield {
            "type": "end",
            "reason": reason,
            "scanned": scanned,
            "bytes": read,
            "matched": matched,
            "seconds": round(self.clock() - began, 3),
            "continue": {"scan": "forward" if self.forward else "backward", "at": positions_text(onward), "done": done},
            "back": self._other_way(),
        }


def _hws(client: LiftbridgeClient, stream: str) -> tuple[dict[int, int], dict[int, str]]:
    """Per partition its high watermark, and the paused ones (the view does not resume them)."""
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None or not info.partitions:
        raise NoSuchStreamError(f"stream {stream!r} does not exist: check the name on the Cluster tab")
    hws = {p: part.high_watermark for p, part in info.partitions.items()}
    paused = {p: "paused: the view does not resume it" for p, part in info.partitions.items() if part.paused}
    return hws, paused


def _first_at(client: LiftbridgeClient, stream: str, partition: int, at: dt.datetime, hw: int) -> int:
    """The offset of the first message at or after ``at`` (``hw + 1``: none)."""
    if hw < 0:
        return 0
    try:
        messages = client.subscribe(stream, partition=partition, start_at=at, stop_at=hw)
    except InvalidArgumentError:  # the server refuses a time after its last message
        return hw + 1
    try:
        first = next(messages, None)
    except InvalidArgumentError:
        return hw + 1
    finally:
        messages.close()  # type: ignore[attr-defined]
    return first.offset if first is not None else hw + 1


def plan(
    client: LiftbridgeClient,
    stream: str,
    *,
    partition: str | None = None,
    order: str | None = None,
    offset: str | None = None,
    at_time: str | None = None,
    at: str | None = None,
    scan: str | None = None,
    key: str | None = None,
    value: str | None = None,
    path: str | None = None,
    header: str | None = None,
    limit: str | None = None,
    max_bytes: str | None = None,
) -> Search:
    """Check a search's input (all as typed: text) and plan it: the partitions (one, or all but
    the paused ones), the direction (``order`` newest = backward, oldest = forward; ``scan`` when
    paging), and each partition's first offset: from ``offset``, from ``at_time`` (newest first:
    the last message at or before it; oldest first: the first at or after it), from a page
    position ``at``, or from the newest / oldest message.

    :raises SearchInputError: a bad field (named), or more than one of offset, time and at.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: no such stream or partition.
    :raises PartitionPausedError: the one partition asked for is paused.
    """
    order = blank(order) or "newest"
    if order not in ("newest", "oldest"):
        raise SearchInputError("order", f"order must be newest or oldest; got {order!r}")
    scan = blank(scan)
    if scan not in (None, "forward", "backward"):
        raise SearchInputError("scan", f"scan must be forward or backward; got {scan!r}")
    forward = scan == "forward" if scan else order == "oldest"
    part = blank(partition)
    one = None if part in (None, "all") else parse_offset(part, "partition")
    from_offset = parse_offset(offset)
    from_time = parse_time(at_time)
    positions = parse_positions(at)
    given = [n for n, v in (("offset", from_offset), ("time", from_time), ("at", positions)) if v is not None]
    if len(given) > 1:
        raise SearchInputError(given[1], f"start from an offset or from a time, not both ({' and '.join(given)})")
    search = Search(
        client,
        stream,
        {},
        {},
        forward,
        parse_count(limit, "page size", 20, MAX_PAGE) or 20,
        key=parse_key(key),
        value=value.encode() if value else None,
        path=parse_json_path(path),
        header=header_filter(header),
        max_bytes=parse_count(max_bytes, "max_bytes", MAX_SCAN_BYTES, MAX_SCAN_BYTES) or MAX_SCAN_BYTES,
    )
    if not blank(stream):
        raise SearchInputError("stream", "name a stream (see the Cluster tab)")
    hws, paused = _hws(client, stream)
    if one is not None:
        if one not in hws:
            raise NoSuchPartitionError(f"stream {stream!r} has no partition {one} (it has {sorted(hws)})")
        if one in paused:
            raise PartitionPausedError(f"partition {one} of {stream!r} is paused")
        chosen = [one]
    else:
        chosen = sorted(p for p in hws if p not in paused)
        search.skipped = {p: paused[p] for p in sorted(paused)}
    if positions is not None:
        chosen = [p for p in chosen if p in positions]
    search.high_watermarks = {p: hws[p] for p in chosen}
    for p in chosen:
        hw = hws[p]
        if positions is not None:  # never past the high watermark: that would wait for new messages
            start = positions[p] if forward else min(positions[p], hw)
        elif from_offset is not None:
            start = from_offset if forward else min(from_offset, hw)
        elif from_time is not None:
            if forward:
                start = _first_at(client, stream, p, from_time, hw)
            else:  # the last message at or before the time: just before the first one after it
                start = _first_at(client, stream, p, from_time + dt.timedelta(microseconds=1), hw) - 1
        else:
            start = 0 if forward else hw
        search.start[p] = start
    return search


def message_at(client: LiftbridgeClient, stream: str, partition: str, offset: str) -> Message:
    """The message at ``offset`` of a partition.

    :raises SearchInputError: a bad partition or offset.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: no such stream or partition;
        also (as ``NoSuchPartitionError``) no message at that offset (not yet, or removed).
    :raises PartitionPausedError: the partition is paused.
    """
    p = parse_offset(partition, "partition")
    o = parse_offset(offset)
    if p is None or o is None:
        raise SearchInputError("offset", "give a partition and an offset (whole numbers, 0 or more)")
    hws, paused = _hws(client, stream)
    if p not in hws:
        raise NoSuchPartitionError(f"stream {stream!r} has no partition {p} (it has {sorted(hws)})")
    if p in paused:
        raise PartitionPausedError(f"partition {p} of {stream!r} is paused")
    found = None
    if o <= hws[p]:
        # Up to the high watermark: a stop at o is never reached when retention removed o.
        messages = client.subscribe(stream, partition=p, start_at=o, stop_at=hws[p])
        try:
            found = next(messages, None)
        finally:
            messages.close()  # type: ignore[attr-defined]
    if found is None or found.offset != o:
        raise NoSuchPartitionError(
            f"partition {p} of {stream!r} has no message at offset {o} (its high watermark is {hws[p]};"
            " older messages may have been removed by retention or compaction)"
        )
    return found
