"""Partitioners: the key partitioner matches the Go client's rule bit for bit."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    KeyPartitioner,
    RoundRobinPartitioner,
    partition_for_key,
)

# CRC-32 (IEEE) check values, independent of zlib: the standard "123456789" check value
# 0xCBF43926 and crc32("foo") = 0x8C736521. The Go client computes
# crc32.ChecksumIEEE(key) % uint32(partitions), a nil key hashing as "".
GO_VECTORS = [
    (b"123456789", 0xCBF43926),
    (b"foo", 0x8C736521),
    (b"", 0),
]


@pytest.mark.parametrize(("key", "crc"), GO_VECTORS)
@pytest.mark.parametrize("partitions", [1, 2, 3, 5, 7, 16, 1000])
def test_key_partition_is_crc32_ieee_modulo_count(key: bytes, crc: int, partitions: int) -> None:
    assert partition_for_key(key, partitions) == crc % partitions


def test_known_partitions_of_fixed_keys() -> None:
    # Hand-computed from the check values above: 0xCBF43926 = 3421780262.
    assert [partition_for_key(b"123456789", n) for n in (2, 3, 5, 7, 16)] == [0, 2, 2, 5, 6]
    assert [partition_for_key(b"foo", n) for n in (2, 3, 5, 7, 16)] == [1, 2, 4, 2, 1]


def test_none_key_hashes_as_empty_key() -> None:
    assert partition_for_key(None, 7) == partition_for_key(b"", 7) == 0


def test_key_partitioner_callable_signature() -> None:
    p = KeyPartitioner()
    assert p("stream", b"foo", b"ignored", 3) == 2
    assert p("other", b"foo", b"", 3) == 2  # the stream name plays no part


def test_round_robin_counts_per_stream() -> None:
    rr = RoundRobinPartitioner()
    assert [rr("a", None, b"", 3) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert [rr("b", None, b"", 2) for _ in range(3)] == [0, 1, 0]
    assert rr("a", None, b"", 3) == 2


def test_round_robin_is_thread_safe() -> None:
    rr = RoundRobinPartitioner()
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        got = [rr("s", None, b"", 4) for _ in range(1000)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen.count(p) for p in range(4)) == [1000, 1000, 1000, 1000]


@pytest.mark.parametrize("count", [0, -1])
def test_bad_partition_count_is_refused(count: int) -> None:
    with pytest.raises(InvalidArgumentError, match="partition_count"):
        partition_for_key(b"x", count)
    with pytest.raises(InvalidArgumentError, match="partition_count"):
        RoundRobinPartitioner()("s", None, b"", count)
