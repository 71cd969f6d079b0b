"""Consumer groups: a member joining mid-stream costs at most about one second of messages read
twice (docs/consumer-groups.md, "Rebalance"), with Liftbridge's default 15 s consumer timeout, where
the heartbeat alone (every 0.7 x 15 s) would let the old owner read the moved partition ~10 s on."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import GroupConsumer, LiftbridgeClient
from tests import margins

#: Messages per second published to each partition (the rate the duplicate bound is derived from).
RATE = 40
SECONDS = 4.0
JOIN_AT = 1.5


@pytest.fixture
def client(lb_address: str) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(lb_address, timeout=5.0) as c:
        yield c


def _consume(consumer: GroupConsumer, seen: list[tuple[int, int]], stop: threading.Event) -> None:
    while not stop.is_set():
        seen.extend((m.partition, m.offset) for m in consumer.messages(timeout=0.2))


def test_a_member_joining_mid_stream_reads_at_most_a_second_of_messages_twice(
    lb_address: str, client: LiftbridgeClient, stream_name: str
) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    group = "rebalance-" + stream_name
    total = int(2 * RATE * SECONDS)
    stop = threading.Event()
    seen_a: list[tuple[int, int]] = []
    seen_b: list[tuple[int, int]] = []
    with (
        LiftbridgeClient(lb_address, timeout=5.0) as ca,
        LiftbridgeClient(lb_address, timeout=5.0) as cb,
        ca.group_consumer(group, stream_name, auto_offset="earliest") as a,
    ):
        reader_a = threading.Thread(target=_consume, args=(a, seen_a, stop))
        reader_a.start()
        try:
            start = time.monotonic()
            b: GroupConsumer | None = None
            reader_b: threading.Thread | None = None
            for i in range(total):  # RATE messages per second on each partition, in turn
                time.sleep(max(0.0, start + i / (2 * RATE) - time.monotonic()))
                client.publish(stream_name, b"%d" % i, partition=i % 2)
                if b is None and time.monotonic() - start >= JOIN_AT:
                    b = cb.group_consumer(group, stream_name, auto_offset="earliest")
                    b.join()
                    reader_b = threading.Thread(target=_consume, args=(b, seen_b, stop))
                    reader_b.start()
            assert b is not None and reader_b is not None
            per_partition = {0: total // 2, 1: total // 2}

            def all_read() -> bool:
                read = set(seen_a) | set(seen_b)
                return all((p, o) in read for p, n in per_partition.items() for o in range(n))

            with contextlib.suppress(AssertionError):  # the asserts below say what was missed
                margins.wait_until(all_read, 30, "every message read by someone", interval=0.1)
        finally:
            stop.set()
            reader_a.join(10)
            if reader_b is not None:
                reader_b.join(10)
        assert b is not None
        moved = b.assignments[stream_name]
        b.leave()
    assert len(moved) == 1, f"the join should have moved one partition to b, it has {moved}"
    read = set(seen_a) | set(seen_b)
    assert all((p, o) in read for p in (0, 1) for o in range(total // 2)), "a message was never read"
    assert any(p == moved[0] for p, _ in seen_a), "a read the moved partition before the join"
    twice = len(set(seen_a) & set(seen_b)) + (len(seen_a) - len(set(seen_a))) + (len(seen_b) - len(set(seen_b)))
    # At most what the moved partition received in about one second (one assignment check).
    assert twice <= RATE * 1.0, f"{twice} messages read twice (bound {RATE})"
