"""What exactly-once publishing needs of the publisher it wraps (:class:`Sender`), and how it
reads its input (:func:`chunks`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..publishing.columns import RecordColumns
from ..types import Ack, Record

__all__ = ["Sender", "chunks"]


class Sender(Protocol):
    """What exactly-once publishing needs of the publisher it wraps: publish one batch of records
    (each with its partition and expected offset set) and return their acks in input order,
    raising :class:`PublishError` when some record got no ack or was refused.

    It must never re-send a record on its own (a ``BatchPublisher`` opened with
    ``resend=NO_RESEND``): whether a record whose ack is missing is in the stream is for the
    exactly-once publisher to find out by reading.
    """

    def send(self, records: Sequence[Record]) -> Sequence[Ack]: ...

    def reset(self) -> bool | None:
        """Drop connections after a failure, so nothing queued in them is delivered later;
        return ``True`` when everything sent is known to have reached the server. Otherwise
        the resumption watches the partitions ``quiet`` seconds for records still on the way.
        (A ``BatchPublisher`` is asked to flush its NATS connection first.)"""

    def close(self) -> None: ...


def chunks(records: Iterable[Record | bytes], size: int) -> Iterable[Sequence[Any]]:
    """``records`` ``size`` at a time: slices of columns (kept as columns), else lists read lazily."""
    if records.__class__ is RecordColumns:
        columns: RecordColumns = records
        return (columns[i : i + size] for i in range(0, len(columns), size))
    iterator = iter(records)
    return iter(lambda: list(itertools.islice(iterator, size)), [])
