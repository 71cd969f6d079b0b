"""Correlation ids of one bulk publish: a record's own, or one made up per call, matched back
to the record when its ack comes in (the NATS engine and the batch route both use them)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from ..errors import InvalidArgumentError
from ..types import Record

__all__ = ["CorrelationIds", "correlation_ids"]


class CorrelationIds(Sequence[str]):
    """The correlation ids of one call: a record's own, or ``<prefix><index>`` with a prefix
    random per call (unique across calls and processes, as a 48-bit random value can be).

    Generated ids are never stored: they are formatted when a frame is built, and an ack's
    record index is parsed back out of its id.
    """

    def __init__(self, n: int, own: Mapping[int, str], prefix: str | None = None) -> None:
        self._n = n
        self.prefix = prefix if prefix is not None else uuid.uuid4().hex[:12] + "-"
        self.prefix_bytes = self.prefix.encode()
        self._plen = len(self.prefix)
        self.own = dict(own)
        self.own_bytes = {i: cid.encode() for i, cid in self.own.items()}
        self._own_index = {cid: i for i, cid in self.own.items()}
        if len(self._own_index) != len(self.own) or any(self._generated(cid) >= 0 for cid in self.own.values()):
            raise InvalidArgumentError("correlation ids must be unique within one publish_many call")

    @classmethod
    def of(cls, ids: Sequence[str]) -> CorrelationIds:
        """Wrap any sequence of ids (each is a record's own).

        :raises InvalidArgumentError: two ids are equal.
        """
        return cls(len(ids), dict(enumerate(ids)))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        i %= self._n
        return self.own.get(i) or f"{self.prefix}{i}"

    def _generated(self, cid: str) -> int:
        """The index of a generated id, or -1."""
        if not cid.startswith(self.prefix):
            return -1
        tail = cid[self._plen :]
        if not tail.isdigit() or not tail.isascii():
            return -1
        i = int(tail)
        return i if i < self._n and i not in self.own else -1

    def index_of(self, cid: str) -> int:
        """The index of the record with correlation id ``cid``, or -1 if none has it."""
        i = self._own_index.get(cid) if self._own_index else None
        return self._generated(cid) if i is None else i


def correlation_ids(records: Sequence[Record | bytes]) -> CorrelationIds:
    """One correlation id per record: its own, or ``<call prefix><index>``.

    :raises InvalidArgumentError: two records share a correlation id.
    """
    if set(map(type, records)) <= {bytes}:
        return CorrelationIds(len(records), {})
    own = {i: rec.correlation_id for i, rec in enumerate(records) if isinstance(rec, Record) and rec.correlation_id}
    return CorrelationIds(len(records), own)
