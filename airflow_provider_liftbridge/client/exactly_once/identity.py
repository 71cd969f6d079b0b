"""Who wrote a record: the producer id and sequence number every exactly-once record carries
(headers ``lb-producer`` and ``lb-seq``, ADR 2), the cursor holding a producer's scan start, and
their encoding. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from airflow_provider_liftbridge.codec import header_field, header_field_head

from ..errors import InvalidArgumentError

__all__ = [
    "CURSOR_PREFIX",
    "MAX_PRODUCER_ID",
    "PRODUCER_HEADER",
    "SEQ_HEADER",
    "SeqWires",
    "check_producer_id",
    "producer_cursor_id",
    "producer_id_for",
    "record_wire",
    "seq_of",
]

#: Header naming the producer of a record.
PRODUCER_HEADER = "lb-producer"
#: Header holding the record's sequence number (ASCII decimal).
SEQ_HEADER = "lb-seq"
#: Prefix of the cursor that stores a producer's scan start.
CURSOR_PREFIX = "lb-producer:"
#: Longest producer id accepted (it travels in every record's headers).
MAX_PRODUCER_ID = 512


def producer_id_for(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> str:
    """The default producer id of an Airflow task instance: ``dag_id/task_id/run_id[/map_index]``.

    It is the same for every try of the task instance and differs between runs, so a retry
    resumes its own earlier tries and nothing else.

    :raises InvalidArgumentError: an empty part.
    """
    parts = [dag_id, task_id, run_id]
    if any(not isinstance(p, str) or not p for p in parts):
        raise InvalidArgumentError(f"dag_id, task_id and run_id must be non-empty strings, got {parts!r}")
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(parts)


def producer_cursor_id(producer_id: str) -> str:
    """The cursor id under which a producer's scan start is stored (one per stream partition)."""
    return CURSOR_PREFIX + producer_id


def check_producer_id(producer_id: Any) -> str:
    """``producer_id``, checked.

    :raises InvalidArgumentError: not a non-empty string, or longer than :data:`MAX_PRODUCER_ID`.
    """
    if not isinstance(producer_id, str) or not producer_id.strip():
        raise InvalidArgumentError(f"producer_id must be a non-empty string, got {producer_id!r}")
    if len(producer_id) > MAX_PRODUCER_ID:
        raise InvalidArgumentError(
            f"producer_id is {len(producer_id)} characters long; keep it under {MAX_PRODUCER_ID} (it is sent with "
            "every record)"
        )
    return producer_id


def seq_of(headers: Mapping[str, bytes], producer: bytes) -> int | None:
    """The sequence number of a message if ``producer`` wrote it, else ``None``."""
    if headers.get(PRODUCER_HEADER) != producer:
        return None
    raw = headers.get(SEQ_HEADER)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def record_wire(producer_field: bytes, producer: bytes, seq: int, own: Mapping[str, bytes] | None) -> bytes:
    """The encoded headers of record ``seq``: the record's own headers (``own``), then the
    producer's entry (``producer_field``, encoded once by the caller) and the sequence number,
    which win a clash of names."""
    seq_b = b"%d" % seq
    if own:
        merged = {**own, PRODUCER_HEADER: producer, SEQ_HEADER: seq_b}
        return b"".join(header_field(name, data) for name, data in merged.items())
    return producer_field + header_field_head(SEQ_HEADER, len(seq_b)) + seq_b


class SeqWires(Sequence[bytes]):
    """The encoded headers of records ``seqs`` of one producer, made when asked for: the batch
    publisher asks for a burst at a time, as it frames the records, so the work is spread over
    the send (where it overlaps the server's) instead of coming before it."""

    __slots__ = ("_producer_field", "_seqs")

    def __init__(self, producer_field: bytes, seqs: Sequence[int]) -> None:
        self._producer_field = producer_field
        self._seqs = seqs

    def __len__(self) -> int:
        return len(self._seqs)

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        producer, head = self._producer_field, header_field_head
        if isinstance(i, slice):
            return [producer + head(SEQ_HEADER, len(s)) + s for s in map(b"%d".__mod__, self._seqs[i])]
        seq = b"%d" % self._seqs[i]
        return producer + head(SEQ_HEADER, len(seq)) + seq
