"""Exactly-once publishing (ADRs 2 and 8): a producer id and sequence numbers on every record, a
durable per-partition scan start, resumption by reading instead of re-sending blindly, and no
success beside another writer of the same producer id.

The package wraps the caller's publisher (:meth:`ExactlyOncePublisher.wrapping`) and reads
through the caller's client. Its rooms:

- :mod:`.identity`: the headers, the producer id, the cursor id (no I/O);
- :mod:`.state`: what the producer knows: sequence numbers seen, per-partition progress, results;
- :mod:`.tail`: the tail reader: reads the partitions and waits until reading them is safe;
- :mod:`.decision`: the resend decision: resume or stop, which broker may still deliver;
- :mod:`.sender`: what it needs of the publisher it wraps, and how it reads its input;
- :mod:`.publisher`: :class:`ExactlyOncePublisher`, which ties them together;
- :mod:`.recount`: the read after a leader change: each record counted as stored is there once;
- :mod:`.between`: rule 5 of ADR 8 done once for publishers side by side (the tasks of a Spark
  job): the offsets between their records that none of them was acknowledged for;
- :mod:`.errors`: its errors.

No Airflow, no PySpark. See ``docs/exactly-once.md``.
"""

from .errors import (
    ConcurrentProducerError,
    ExactlyOnceError,
    ExactlyOncePublishError,
    HistoryMismatchError,
    ReplacedHistoryError,
    SilentBrokerError,
    TruncatedLogError,
    UncommittedTailError,
)
from .identity import CURSOR_PREFIX, PRODUCER_HEADER, SEQ_HEADER, producer_cursor_id, producer_id_for
from .publisher import ExactlyOncePublisher
from .sender import Sender
from .state import ExactlyOnceResult, SeqSet
from .tail import read_producer_records

__all__ = [
    "CURSOR_PREFIX",
    "PRODUCER_HEADER",
    "SEQ_HEADER",
    "ConcurrentProducerError",
    "ExactlyOnceError",
    "ExactlyOncePublishError",
    "ExactlyOncePublisher",
    "ExactlyOnceResult",
    "HistoryMismatchError",
    "ReplacedHistoryError",
    "SeqSet",
    "Sender",
    "SilentBrokerError",
    "TruncatedLogError",
    "UncommittedTailError",
    "producer_cursor_id",
    "producer_id_for",
    "read_producer_records",
]
