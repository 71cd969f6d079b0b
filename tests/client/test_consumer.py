"""Consumer-group members (client/consumer.py) against the dev server's groups (devserver/groups.py).

Servers here have short group timeouts (the ``groups_server`` fixture; the cluster test its own) so
that rebalances, timeouts and a coordinator change happen within a test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from airflow_provider_liftbridge.client import (
    AsyncLiftbridgeClient,
    ConsumerGroupError,
    GroupConsumer,
    LiftbridgeClient,
    Record,
)
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from airflow_provider_liftbridge.devserver import DevServer
from tests import margins


@pytest.fixture
def client(groups_server: DevServer) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(groups_server.address, timeout=5.0) as c:
        yield c


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _publish(client: LiftbridgeClient, stream: str, partition: int, n: int, tag: str = "m") -> None:
    client.publish_many(stream, [Record(f"{tag}-{partition}-{i}".encode(), partition=partition) for i in range(n)])


def _read(consumer: GroupConsumer, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
    return [(m.partition, m.offset) for m in consumer.messages(max_messages=n, timeout=timeout)]


def _wait_until(check: Callable[[], object], timeout: float = 10.0) -> None:
    margins.wait_until(check, timeout, "condition", interval=0.1)


def test_single_member_reads_every_partition_and_resumes_from_the_commit(
    client: LiftbridgeClient, stream_name: str
) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    for p in (0, 1):
        _publish(client, stream_name, p, 3)
    group = _group()
    with client.group_consumer(group, stream_name, auto_offset="earliest", auto_commit_interval=None) as consumer:
        assert consumer.assignments == {stream_name: [0, 1]}
        got = _read(consumer, 6)
        assert sorted(got) == [(p, o) for p in (0, 1) for o in range(3)]
        assert consumer.commit() == 2
        assert client.fetch_cursor(group_cursor_id(group), stream_name, 1) == 2
        consumer.member.auto_commit_interval = 5.0  # so leaving commits too
    for p in (0, 1):
        _publish(client, stream_name, p, 2, tag="later")
    # A new member of the same group starts where the group's cursors are: only the new messages.
    with client.group_consumer(group, [stream_name], auto_offset="earliest") as again:
        assert sorted(_read(again, 4)) == [(p, o) for p in (0, 1) for o in (3, 4)]
        assert list(again.messages(timeout=0.3)) == []


def test_new_only_starts_after_what_was_there(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    _publish(client, stream_name, 0, 2)
    with client.group_consumer(_group(), stream_name) as consumer:
        _publish(client, stream_name, 0, 1, tag="new")
        msgs = list(consumer.messages(max_messages=1, timeout=10))
        assert [(m.offset, m.value) for m in msgs] == [(2, b"new-0-0")]


def test_auto_offset_none_refuses_a_partition_without_position(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    with pytest.raises(ConsumerGroupError, match="no committed position"):
        client.group_consumer(_group(), stream_name, auto_offset="none").join()


def test_join_with_a_missing_stream_names_the_stream(client: LiftbridgeClient, stream_name: str) -> None:
    with pytest.raises(ConsumerGroupError, match=f"stream {stream_name} does not exist"):
        client.group_consumer(_group(), stream_name).join()


def test_rebalance_splits_partitions_and_leave_hands_them_back(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    group = _group()
    a = client.group_consumer(group, stream_name, consumer_id="a", auto_offset="earliest")
    b = client.group_consumer(group, stream_name, consumer_id="b", auto_offset="earliest")
    a.join()
    assert a.assignments == {stream_name: [0, 1]}
    b.join()
    assert b.assignments == {stream_name: [1]}
    # a learns of the rebalance at its next heartbeat (a third of a second) and gives partition 1 up.
    _wait_until(lambda: (list(a.messages(timeout=0.1)), a.assignments)[1] == {stream_name: [0]})
    for p in (0, 1):
        _publish(client, stream_name, p, 3)
    got_a, got_b = _read(a, 3), _read(b, 3)
    assert sorted(got_a) == [(0, o) for o in range(3)] and sorted(got_b) == [(1, o) for o in range(3)]
    b.leave()  # commits partition 1 at offset 2 (auto-commit is on)
    _publish(client, stream_name, 1, 1, tag="after")
    # a takes partition 1 back and continues after b's commit: no message read twice.
    assert _read(a, 1) == [(1, 3)]
    assert a.assignments == {stream_name: [0, 1]}
    a.leave()


@contextmanager
def _frozen(consumer: GroupConsumer) -> Iterator[None]:
    """The member's process stopped (SIGSTOP, a VM pause): neither its caller nor its keeper runs.
    Holding the member does that: both take it for every call (client/group_consumer.py)."""
    with consumer._held:
        yield


def test_silent_member_times_out_and_rejoins_when_it_comes_back(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    group = _group()
    quiet = client.group_consumer(group, stream_name, consumer_id="a-quiet", auto_offset="earliest")
    busy = client.group_consumer(group, stream_name, consumer_id="b-busy", auto_offset="earliest")
    quiet.join()
    busy.join()
    assert busy.assignments == {stream_name: [1]}
    with _frozen(quiet):
        # Only busy heartbeats (its keeper); after the 1 s member timeout the coordinator gives it
        # both partitions, and that lasts while quiet is stopped.
        _wait_until(lambda: busy.check_assignments() == {stream_name: [0, 1]})
    # quiet's next call finds its epoch stale (v1.9: refused), then itself out of the group; it
    # joins again, and the partitions are split again: both states last while both members run.
    _wait_until(lambda: quiet.check_assignments() == {stream_name: [0]})
    assert quiet.member.joined
    _wait_until(lambda: busy.check_assignments() == {stream_name: [1]})
    quiet.leave()
    busy.leave()


def test_async_member_reads_and_commits(groups_server: DevServer, client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    for p in (0, 1):
        _publish(client, stream_name, p, 2)
    group = _group()

    async def run() -> list[tuple[int, int]]:
        async with AsyncLiftbridgeClient(groups_server.address, timeout=5.0) as aclient:
            async with aclient.group_consumer(group, stream_name, auto_offset="earliest") as consumer:
                got = [(m.partition, m.offset) async for m in consumer.messages(max_messages=4, timeout=10)]
                await consumer.commit()
                return got

    assert sorted(asyncio.run(run())) == [(p, o) for p in (0, 1) for o in (0, 1)]
    assert [client.fetch_cursor(group_cursor_id(group), stream_name, p) for p in (0, 1)] == [1, 1]


def test_coordinator_change_in_cluster_mode(stream_name: str) -> None:
    """The coordinator broker stops; the member reports it after the coordinator timeout, another
    broker takes the group over, and the member goes on reading from where it was."""
    with DevServer(brokers=3, groups_consumer_timeout=1.0, groups_coordinator_timeout=1.0) as cluster:
        with LiftbridgeClient(cluster.addresses, timeout=3.0, max_retries=2) as client:
            client.create_stream(stream_name, stream_name, partitions=2, replication_factor=3)
            consumer = client.group_consumer(_group(), stream_name, auto_offset="earliest")
            consumer.join()
            old = consumer.member.coordinator
            for p in (0, 1):
                _publish(client, stream_name, p, 2)
            assert len(_read(consumer, 4)) == 4
            cluster.stop_broker(cluster.broker_ids.index(old))
            for p in (0, 1):
                _publish(client, stream_name, p, 1, tag="after")
            got = _read(consumer, 2, timeout=20)
            assert sorted(got) == [(0, 2), (1, 2)]  # nothing lost, nothing repeated
            _wait_until(lambda: (list(consumer.messages(timeout=0.2)), consumer.member.coordinator)[1] != old, 20)
            assert (
                consumer.member.coordinator in cluster.broker_ids and consumer.member.coordinator_silent_since is None
            )
            consumer.leave()
