"""Subscriptions delivered as columns: :meth:`LiftbridgeClient.subscribe_columns` hands over a
partition's messages ``rows`` at a time as lists (offsets, keys, values, timestamps, headers), with
no :class:`~.types.Message` per message, for readers that build columnar data (Spark's Arrow
batches, Parquet) and would otherwise take each message apart again.

Each delivered message is only held (its protobuf, as gRPC made it) and its offset checked; every
:data:`HELD_MESSAGES` messages the columns are pulled out of the held ones in one pass each
(``map``, at C speed) and the protobufs let go, and the headers are stored once per distinct set:
almost every Liftbridge message carries just the server's ``subject`` / ``reply`` headers, the
same on every message of a partition (see :meth:`.SubscriptionState.take`), so a batch usually
holds one header set that every row points to.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .compression import COMPRESSION_HEADER, decompress_value
from .effects import Emit, Op
from .errors import InvalidArgumentError
from .requests import StartAt, StopAt
from .subscription import SubscriptionState, follow

if TYPE_CHECKING:
    from airflow_provider_liftbridge._proto import api_pb2

    from .routing import ClientCore

__all__ = ["DEFAULT_COLUMN_ROWS", "MessageColumns", "subscribe_columns"]

#: Messages per delivered :class:`MessageColumns` unless the caller says otherwise.
DEFAULT_COLUMN_ROWS = 8192
#: Protobufs held at most before their columns are pulled out. Holding a whole batch's cost
#: ~0.7 µs per message more than building a Message each (``subscribe``): thousands of live
#: protobufs, each with its own arena, leave the CPU caches and feed the cyclic GC's young
#: generation; a few hundred are pulled out while still warm (bench/RESULTS.md, issue 57).
HELD_MESSAGES = 256

_OFFSET = operator.attrgetter("offset")
_KEY = operator.attrgetter("key")
_VALUE = operator.attrgetter("value")
_TIMESTAMP = operator.attrgetter("timestamp")
_HEADERS = operator.attrgetter("headers")
_SUBJECT = operator.attrgetter("subject")
_REPLY = operator.attrgetter("replySubject")


@dataclass(frozen=True, slots=True)
class MessageColumns:
    """Consecutive messages of one partition as columns (row ``i`` is the ``i``-th of every list).

    :param stream: the stream.
    :param partition: the partition.
    :param offsets: offsets, increasing.
    :param keys: keys; ``b""`` for a message without one (Liftbridge does not tell them apart).
    :param values: values (decompressed when published with compression, as ``subscribe`` does).
    :param timestamps: the server's reception times, epoch nanoseconds.
    :param header_sets: the distinct header sets of these rows (read-only mappings).
    :param header_index: per row, its set in ``header_sets``, or -1 when it has no headers.
    """

    stream: str
    partition: int
    offsets: list[int]
    keys: list[bytes]
    values: list[bytes]
    timestamps: list[int]
    header_sets: list[Mapping[str, bytes]]
    header_index: list[int]

    def __len__(self) -> int:
        return len(self.offsets)

    def headers(self, row: int) -> Mapping[str, bytes] | None:
        """Row ``row``'s headers, ``None`` when it has none."""
        which = self.header_index[row]
        return None if which < 0 else self.header_sets[which]


class ColumnSubscriptionState(SubscriptionState):
    """A subscription's state whose sink (``take``) delivers :class:`MessageColumns` of ``rows``
    messages (fewer for the last one: :meth:`flush`) instead of a message each."""

    def __init__(
        self, stream: str, partition: int, start_at: StartAt, stop_at: StopAt, *, rows: int, **options: Any
    ) -> None:
        super().__init__(stream, partition, start_at, stop_at, **options)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise InvalidArgumentError(f"rows must be an int >= 1, got {rows!r}")
        self._rows = rows
        self._held: list[api_pb2.Message] = []
        self._new_batch()

    def _new_batch(self) -> None:
        self._offsets: list[int] = []
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._timestamps: list[int] = []
        self._sets: list[Mapping[str, bytes]] = []
        self._set_at: dict[int, int] = {}  # id() of a set in ``_sets`` -> its index there
        self._index: list[int] = []
        self._pull_at = min(HELD_MESSAGES, self._rows)

    # The offset bookkeeping of SubscriptionState.take, inline: this runs once per message and a
    # method call more would cost as much as the rest of it.
    def take(self, pb: api_pb2.Message) -> MessageColumns | None:  # type: ignore[override]  # a batch, not a Message
        """Hold a message after the handshake; the batch once it is full or holds the stop offset
        (``None`` otherwise, and for a repeat of a delivered offset)."""
        offset = pb.offset
        if offset < self._next_offset:
            return None
        if offset > self._stop_offset:  # the stop offset is gone (see SubscriptionState.take)
            self.done = True
            return self.flush()
        self._next_offset = offset + 1
        self.last_offset = offset
        held = self._held
        held.append(pb)
        if offset == self._stop_offset:
            self.done = True
            return self.flush()
        if len(held) >= self._pull_at:
            self._pull()
            if len(self._offsets) >= self._rows:
                return self.flush()
        return None

    def flush(self) -> MessageColumns | None:
        """The messages taken so far as columns (``None`` if there are none); holds none after."""
        self._pull()
        if not self._offsets:
            return None
        columns = MessageColumns(
            self.stream,
            self.partition,
            self._offsets,
            self._keys,
            self._values,
            self._timestamps,
            self._sets,
            self._index,
        )
        self._new_batch()
        return columns

    def _pull(self) -> None:
        """Add the held messages to the batch's columns and let their protobufs go."""
        held, self._held = self._held, []
        if not held:
            return
        values = list(map(_VALUE, held))
        sets, index = self._headers(held, values)
        self._offsets += map(_OFFSET, held)
        self._keys += map(_KEY, held)
        self._values += values
        self._timestamps += map(_TIMESTAMP, held)
        self._pull_at = min(HELD_MESSAGES, self._rows - len(self._offsets))
        if not sets:
            self._index += index  # all -1
            return
        at = []  # where each of ``sets`` is in the batch's sets: the shared one recurs in every pull
        for entries in sets:
            where = self._set_at.get(id(entries))
            if where is None:
                where = self._set_at[id(entries)] = len(self._sets)
                self._sets.append(entries)
            at.append(where)
        if len(at) == 1 and index.count(0) == len(index):
            self._index += [at[0]] * len(index)
        else:
            self._index += [-1 if which < 0 else at[which] for which in index]

    def _headers(self, held: list[api_pb2.Message], values: list[bytes]) -> tuple[list[Mapping[str, bytes]], list[int]]:
        """The distinct header sets of ``held`` and each message's set (-1: none); a compressed
        value in ``values`` is replaced by the original."""
        rows = len(held)
        counts = list(map(len, map(_HEADERS, held)))
        if not any(counts):
            return [], [-1] * rows
        if counts.count(2) == rows and len(set(zip(map(_SUBJECT, held), map(_REPLY, held), strict=True))) == 1:
            shared = self._shared(held[0])
            if shared is not None:  # the usual batch: the server's two headers on every message
                return [shared], [0] * rows
        sets: list[Mapping[str, bytes]] = []
        index: list[int] = []
        shared_at = -1  # where the shared server headers went in ``sets``
        for row, pb in enumerate(held):
            count = counts[row]
            if count == 0:
                index.append(-1)
                continue
            if count == 2 and shared_at >= 0:
                known_subject, known_reply, _ = self._server_headers
                if pb.subject == known_subject and pb.replySubject == known_reply:
                    index.append(shared_at)
                    continue
            if count == 2:
                shared = self._shared(pb)
                if shared is not None:
                    shared_at = len(sets)
                    index.append(shared_at)
                    sets.append(shared)
                    continue
            entries = dict(pb.headers)
            if COMPRESSION_HEADER in entries:
                original = decompress_value(pb.value, entries)
                if original is not None:
                    values[row], entries = original
                    if not entries:
                        index.append(-1)
                        continue
            index.append(len(sets))
            sets.append(entries)
        return sets, index

    def _shared(self, pb: api_pb2.Message) -> Mapping[str, bytes] | None:
        """The server's headers ``pb`` carries, as the mapping shared with the messages of the same
        subject and reply subject; ``None`` when its headers are anything else."""
        known_subject, known_reply, shared = self._server_headers
        if pb.subject == known_subject and pb.replySubject == known_reply and shared:
            return shared
        return self._learn_server_headers(pb)


class StoredSubscriptionState(SubscriptionState):
    """A subscription's state whose sink delivers each message's protobuf as gRPC made it (its
    value not decompressed, no :class:`~.types.Message`): for scans that look at a few headers
    of many messages, such as the exactly-once publisher's reads."""

    # The offset bookkeeping of SubscriptionState.take, inline (see ColumnSubscriptionState.take).
    def take(self, pb: api_pb2.Message) -> api_pb2.Message | None:  # type: ignore[override]  # not a Message
        """The message after the handshake; ``None`` for a repeat of a delivered offset."""
        offset = pb.offset
        if offset < self._next_offset:
            return None
        if offset > self._stop_offset:  # the stop offset is gone (see SubscriptionState.take)
            self.done = True
            return None
        self._next_offset = offset + 1
        self.last_offset = offset
        if offset == self._stop_offset:
            self.done = True
        return pb


def subscribe_stored(core: ClientCore, stream: str, *, partition: int, start_at: StartAt, stop_at: StopAt) -> Op[None]:
    """``subscribe``, delivering each message's protobuf as stored (:class:`StoredSubscriptionState`);
    the same positions, resubscription and errors."""
    state = StoredSubscriptionState(stream, partition, start_at, stop_at, read_isr_replica=False, resume=False)
    yield from follow(core, state)


def subscribe_columns(
    core: ClientCore,
    stream: str,
    *,
    partition: int,
    start_at: StartAt,
    stop_at: StopAt,
    rows: int,
    read_isr_replica: bool,
    resume: bool,
) -> Op[None]:
    """The operation of ``LiftbridgeClient.subscribe_columns`` (documented there)."""
    state = ColumnSubscriptionState(
        stream, partition, start_at, stop_at, rows=rows, read_isr_replica=read_isr_replica, resume=resume
    )
    yield from follow(core, state)
    rest = state.flush()
    if rest is not None:
        yield Emit(rest)
