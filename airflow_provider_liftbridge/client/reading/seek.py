"""The first committed offset stamped at or after a time, even where Liftbridge's time index
answers "the next offset" although such messages exist.

Liftbridge v1.9.0-72 (``commitLog.EarliestOffsetAfterTimestamp`` in ``server/commitlog``) answers
a ``StartPosition.TIMESTAMP`` lookup with the next offset to be written, past messages stamped at
or after the time, in two cases (``docs/consume.md``, "How Liftbridge timestamps messages"):

- the partition's newest segment is empty (rolled by age, ``segment.max.age``, no message since):
  the binary search over the segments reads its first index entry, gets ``io.EOF`` and takes it
  for "after the end of the log";
- the time falls between the last message of the second-to-last segment and the first message of
  the last one (a quiet gap before a roll).

Both answers are "nothing yet" to a bounded read, so only that answer is checked: the newest
committed message's timestamp says whether anything at or after the time exists (timestamps in
order, as Liftbridge's own search assumes). When something does, the offset is found by a binary
search over offsets, each step a one-message bounded read whose timestamp says which half to keep.

Cost, in bounded reads of one message (one Subscribe call each): a lookup that finds a message, 1;
one that finds none, 2 (1 when the caller knows the newest committed timestamp); a lookup the
server answered wrongly, 3 + ceil(log2(high watermark - earliest offset)), e.g. 23 for a million
retained messages.

The search is written once, as a generator that yields what to read and is sent what was read
(:func:`first_offset_search`); :func:`first_offset_at` runs it with the sync client,
:func:`first_offset_at_async` with the async one. Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator

from ..async_client import AsyncLiftbridgeClient
from ..errors import InvalidArgumentError
from ..subscription import read_committed
from ..sync_client import LiftbridgeClient
from ..types import Message, StartPosition

__all__ = [
    "Probe",
    "Seen",
    "first_offset_at",
    "first_offset_at_async",
    "first_offset_search",
    "oldest_retained",
    "time_ns",
]

#: Where a probe reads from: a time (the server's time lookup), an offset, or the earliest message.
Probe = dt.datetime | int | StartPosition

#: What a probe read: the first committed message's ``(offset, timestamp)`` at or after the probe's
#: start and up to the high watermark, or ``None`` when there is none.
Seen = tuple[int, int] | None

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def time_ns(when: dt.datetime) -> int:
    """``when`` in nanoseconds since the epoch, as a subscription's start time is sent (whole µs)."""
    return (when - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def first_offset_search(when: dt.datetime, hw: int, newest_timestamp: int | None = None) -> Generator[Probe, Seen, int]:
    """The search of the module docstring, without I/O: yields probes, is sent what each read, and
    returns the first offset at or before ``hw`` whose message is stamped at or after ``when``
    (``hw + 1`` when none is).

    :param when: the time (aware).
    :param hw: the partition's high watermark (``-1``: empty; nothing is probed).
    :param newest_timestamp: the timestamp of the message at ``hw`` when the caller has it.
    """
    if hw < 0:
        return 0
    target = time_ns(when)
    seen = yield when  # the server's time index
    if seen is not None:
        return seen[0]
    if newest_timestamp is None:
        newest = yield hw
        newest_timestamp = newest[1] if newest is not None else None
    if newest_timestamp is None or newest_timestamp < target:
        return hw + 1  # nothing at or after the time is committed: the lookup was right
    # The lookup skipped messages stamped at or after the time: search by offset. ``low`` is a
    # message stamped before the time; ``found`` the first one known at or after it; no message
    # lies in [top, found), so the answer is the first one at or after the time in (low, top), or
    # ``found``. A probe at ``mid`` reads the first message at or after ``mid`` (compaction and
    # retention leave gaps), so every step at least halves (low, top).
    earliest = yield StartPosition.EARLIEST
    if earliest is None or earliest[1] >= target:
        return earliest[0] if earliest is not None else hw + 1
    low, top, found = earliest[0], hw, hw
    while top - low > 1:
        mid = (low + top) // 2
        seen = yield mid
        if seen is None:  # the messages from mid on went meanwhile (retention): keep what is known
            break
        if seen[1] >= target:
            found, top = seen[0], mid
        else:
            low = seen[0]
    return found


def _read_one(client: LiftbridgeClient, stream: str, partition: int, probe: Probe, hw: int, resume: bool) -> Seen:
    """One bounded read of a probe with the sync client; ``None`` when there is nothing to read."""
    messages = client.subscribe(stream, partition=partition, start_at=probe, stop_at=hw, resume=resume)
    try:
        first: Message | None = next(messages, None)
    except InvalidArgumentError:  # a start past the stop (the lookup answered past ``hw``): nothing
        first = None
    finally:
        messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription
    return None if first is None else (first.offset, first.timestamp)


def oldest_retained(
    client: LiftbridgeClient, stream: str, partition: int, hw: int, *, wait: float | None = None
) -> int:
    """The offset of the oldest message that retention left at or below ``hw`` (``hw + 1`` when it
    left none), in at most ``wait`` seconds (default: the client's ``timeout``) plus three reads,
    never waiting for a new message.

    No API reports it, and EARLIEST cannot simply be read: on a log that retention emptied (only an
    empty segment left), Liftbridge takes EARLIEST as offset 0 and waits for the next message,
    which is past ``hw``. Its time lookup from the epoch answers at once: the oldest message, or
    the next offset (a start past ``hw``, refused). It answers the next offset in two cases: when
    nothing is kept, and for one segment of messages with an empty one after it (the flaw above).
    The message at ``hw`` tells those apart. A kept one is sent at once, so it is read with a wait
    of ``wait``, and EARLIEST is read only after it came. So an emptied log costs ``wait`` seconds.

    :raises PartitionPausedError: the partition is paused.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the partition went away.
    """
    if hw < 0:
        return 0
    seen = _read_one(client, stream, partition, _EPOCH + dt.timedelta(microseconds=1), hw, False)
    if seen is not None:
        return seen[0]
    core = client._core
    bound = core.timeout if wait is None else wait
    newest = client._transport.run(read_committed(core, stream, partition, hw, hw, bound))
    if not newest:
        return hw + 1
    seen = _read_one(client, stream, partition, StartPosition.EARLIEST, hw, False)
    return hw + 1 if seen is None else seen[0]


def first_offset_at(
    client: LiftbridgeClient,
    stream: str,
    partition: int,
    when: dt.datetime,
    hw: int,
    *,
    resume: bool = False,
    newest_timestamp: int | None = None,
) -> int:
    """The offset of the first committed message whose timestamp is at or after ``when`` (``hw +
    1`` when no committed message is that late yet), by :func:`first_offset_search` with the sync
    client. ``resume``: a paused partition is resumed by the reads, else they raise.

    :raises PartitionPausedError: the partition is paused and ``resume`` is false.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the partition went away.
    """
    search = first_offset_search(when, hw, newest_timestamp)
    try:
        probe = next(search)
        while True:
            probe = search.send(_read_one(client, stream, partition, probe, hw, resume))
    except StopIteration as done:
        offset: int = done.value
        return offset


async def _read_one_async(
    client: AsyncLiftbridgeClient, stream: str, partition: int, probe: Probe, hw: int, resume: bool
) -> Seen:
    """:func:`_read_one` with the async client."""
    messages = client.subscribe(stream, partition=partition, start_at=probe, stop_at=hw, resume=resume)
    try:
        first: Message | None = await anext(messages, None)
    except InvalidArgumentError:
        first = None
    finally:
        aclose = getattr(messages, "aclose", None)  # an async generator: closing ends the subscription
        if aclose is not None:
            await aclose()
    return None if first is None else (first.offset, first.timestamp)


async def first_offset_at_async(
    client: AsyncLiftbridgeClient,
    stream: str,
    partition: int,
    when: dt.datetime,
    hw: int,
    *,
    resume: bool = False,
    newest_timestamp: int | None = None,
) -> int:
    """:func:`first_offset_at` with the async client (the same search, the same raises)."""
    search = first_offset_search(when, hw, newest_timestamp)
    try:
        probe = next(search)
        while True:
            probe = search.send(await _read_one_async(client, stream, partition, probe, hw, resume))
    except StopIteration as done:
        offset: int = done.value
        return offset
