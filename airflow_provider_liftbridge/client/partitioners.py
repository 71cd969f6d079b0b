"""Partitioners: which partition a message goes to when the caller does not name one.

The key partitioner computes what the Go client computes (``crc32.ChecksumIEEE(key) %
uint32(partitions)``, a nil key hashing as the empty key), so a record lands on the same
partition whichever client wrote it.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Protocol

from .errors import InvalidArgumentError

__all__ = ["KeyPartitioner", "Partitioner", "PartitionerFunc", "RoundRobinPartitioner", "partition_for_key"]

#: Any callable ``(stream, key, value, partition_count) -> partition`` can partition.
PartitionerFunc = Callable[[str, "bytes | None", bytes, int], int]


class Partitioner(Protocol):
    """What the client calls to choose a partition."""

    def __call__(self, stream: str, key: bytes | None, value: bytes, partition_count: int) -> int: ...


def partition_for_key(key: bytes | None, partition_count: int) -> int:
    """The partition of ``key`` among ``partition_count`` partitions: CRC-32 (IEEE) of the key
    modulo the count, exactly as the Go client (``None`` hashes as ``b""``).

    :raises InvalidArgumentError: ``partition_count`` is less than 1.
    """
    if partition_count < 1:
        raise InvalidArgumentError(f"partition_count must be at least 1, got {partition_count}")
    return zlib.crc32(key or b"") % partition_count


class KeyPartitioner:
    """Partition by key: messages with the same key always go to the same partition."""

    def __call__(self, stream: str, key: bytes | None, value: bytes, partition_count: int) -> int:
        return partition_for_key(key, partition_count)

    def __repr__(self) -> str:
        return "KeyPartitioner()"


class RoundRobinPartitioner:
    """Spread messages over the partitions in turn, with one counter per stream (thread-safe)."""

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, stream: str, key: bytes | None, value: bytes, partition_count: int) -> int:
        if partition_count < 1:
            raise InvalidArgumentError(f"partition_count must be at least 1, got {partition_count}")
        with self._lock:
            n = self._counters.get(stream, 0)
            self._counters[stream] = n + 1
        return n % partition_count

    def __repr__(self) -> str:
        return "RoundRobinPartitioner()"
