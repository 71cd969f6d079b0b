"""A batch's records: :func:`as_record` (bytes or a ``Record``, as a ``Record``) and
``RecordColumns``, one batch of records held as columns, for publishers that make many
records of one shape themselves (exactly-once publishing: a value, the same producer header
and a counter header, an expected offset per record).

A ``Record`` per record costs more than framing it does; the NATS path frames the columns
directly (:meth:`~airflow_provider_liftbridge.codec.PublishEncoder.encode_many`). Everything
else that takes records (the gRPC path, compression, a custom sender in a test) sees a
``Sequence[Record]``: indexing builds the record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from airflow_provider_liftbridge.codec import EncodedHeaders, decode_header_fields

from ..errors import InvalidArgumentError
from ..types import Record

__all__ = ["RecordColumns", "as_record"]


class RecordColumns(Sequence[Record]):
    """Records as columns, all as long as ``values``.

    :param values: the values.
    :param partitions: each record's partition.
    :param header_wires: each record's headers, encoded as
        :func:`~airflow_provider_liftbridge.codec.header_field` writes them (``b""`` for none).
    :param expected_offsets: each record's expected offset, or ``None`` for none at all.
    :param keys: each record's key (``None`` for none), or ``None`` for no keys at all.
    """

    __slots__ = ("values", "partitions", "header_wires", "expected_offsets", "keys")

    def __init__(
        self,
        values: Sequence[bytes],
        partitions: Sequence[int],
        header_wires: Sequence[bytes],
        expected_offsets: Sequence[int] | None = None,
        keys: Sequence[bytes | None] | None = None,
    ) -> None:
        n = len(values)
        lengths = (len(partitions), len(header_wires), n if expected_offsets is None else len(expected_offsets))
        if any(m != n for m in lengths) or (keys is not None and len(keys) != n):
            raise ValueError(f"every column must hold {n} entries")
        self.values = values
        self.partitions = partitions
        self.header_wires = header_wires
        self.expected_offsets = expected_offsets
        self.keys = keys

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> Record: ...

    @overload
    def __getitem__(self, i: slice) -> RecordColumns: ...

    def __getitem__(self, i: int | slice) -> Record | RecordColumns:
        offsets, keys = self.expected_offsets, self.keys
        if isinstance(i, slice):  # each column sliced (a lazy column makes only the slice)
            return RecordColumns(
                self.values[i],
                self.partitions[i],
                self.header_wires[i],
                None if offsets is None else offsets[i],
                None if keys is None else keys[i],
            )
        wire = self.header_wires[i]
        return Record.of_read_only(
            self.values[i],
            None if keys is None else keys[i],
            EncodedHeaders(decode_header_fields(wire), wire) if wire else None,
            self.partitions[i],
            None if offsets is None else offsets[i],
        )

    def __iter__(self) -> Iterator[Record]:
        return map(self.__getitem__, range(len(self)))

    def with_offsets(self, expected_offsets: Sequence[int]) -> RecordColumns:
        """The same records with these expected offsets."""
        return RecordColumns(self.values, self.partitions, self.header_wires, expected_offsets, self.keys)

    def take(self, indices: Sequence[int]) -> RecordColumns:
        """The records at ``indices``, in that order."""
        offsets, keys = self.expected_offsets, self.keys
        return RecordColumns(
            [self.values[i] for i in indices],
            [self.partitions[i] for i in indices],
            [self.header_wires[i] for i in indices],
            None if offsets is None else [offsets[i] for i in indices],
            None if keys is None else [keys[i] for i in indices],
        )


def as_record(index: int, item: Record | bytes) -> Record:
    """``item`` of a batch, at ``index``, as a :class:`Record` (bytes become its value); shared by
    both engines, the batch's planning and the time-out recovery.

    :raises InvalidArgumentError: ``item`` is neither.
    """
    rec = Record(item) if isinstance(item, bytes | bytearray | memoryview) else item
    if not isinstance(rec, Record):
        raise InvalidArgumentError(f"record {index} is a {type(item).__name__}; pass Record objects or bytes")
    return rec
