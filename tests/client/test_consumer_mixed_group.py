"""A GroupConsumer and a member that reads as go-liftbridge does, in one group on the dev server.

The dev server keeps one subscriber per group per partition, as Liftbridge (devserver/group_subscribers.py):
a Subscribe carrying ``consumer`` ends the group's earlier subscriber on that partition. This
project's GroupConsumer subscribes without ``consumer`` (its hand-over is its own: docs/consumer-groups.md,
"Rebalance"), so the rule neither ends nor refuses its reads. Here a partition moves from it to a
Go-style member (raw gRPC: join, fetch the assignments, start after the group's cursor, subscribe
with ``consumer``) and back, and no message is read twice or missed.
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.client import GroupConsumer, LiftbridgeClient, Record
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from tests.margins import bounded

TIMEOUT = 5.0


class _GoReader:
    """A group member's Subscribe, as go-liftbridge sends it, read on a thread."""

    def __init__(self, stub: api_pb2_grpc.APIStub, req: pb.SubscribeRequest) -> None:
        self._call = stub.Subscribe(req, timeout=60)
        self._cond = threading.Condition()
        self.started = self.ended = False
        self.read: list[tuple[int, int]] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for msg in self._call:
                with self._cond:
                    if self.started:
                        self.read.append((msg.partition, msg.offset))
                    self.started = True
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def wait(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.read) >= n or self.ended, TIMEOUT), "no messages in time"
            assert len(self.read) >= n, f"the subscription ended after {self.read}"

    def cancel(self) -> None:
        self._call.cancel()
        with self._cond:
            self._cond.wait_for(lambda: self.ended, TIMEOUT)


def _publish(client: LiftbridgeClient, stream: str, tag: str) -> None:
    for p in (0, 1):
        client.publish_many(stream, [Record(f"{tag}-{p}-{i}".encode(), partition=p) for i in range(2)])


def _read(consumer: GroupConsumer, n: int) -> list[tuple[int, int]]:
    got = [(m.partition, m.offset) for m in consumer.messages(max_messages=n, timeout=10.0)]
    assert len(got) == n, f"read {got}, expected {n} messages"
    return got


def _poll_until(consumer: GroupConsumer, assignments: dict[str, list[int]]) -> None:
    with bounded("the assignments", 10):
        deadline = time.monotonic() + 10
        while consumer.assignments != assignments:
            assert time.monotonic() < deadline, f"assignments stayed {consumer.assignments}"
            assert not list(consumer.messages(timeout=0.1)), "read a message while nothing was published"


def test_a_partition_moves_to_a_go_style_member_and_back_read_once(lb_address: str, stream_name: str) -> None:
    stub = api_pb2_grpc.APIStub(grpc.insecure_channel(lb_address))
    group = f"g-{uuid.uuid4().hex[:8]}"
    cursor_id = group_cursor_id(group)
    with LiftbridgeClient(lb_address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        with client.group_consumer(group, stream_name, consumer_id="a", auto_offset="earliest") as a:
            _publish(client, stream_name, "before")
            read_a = _read(a, 4)
            a.commit()
            # The Go-style member joins; the rebalance gives it partition 1 and it subscribes there at
            # once (epoch 1), after the group's cursor, as go-liftbridge's consumer does.
            epoch = stub.JoinConsumerGroup(
                pb.JoinConsumerGroupRequest(groupId=group, consumerId="go", streams=[stream_name]), timeout=TIMEOUT
            ).epoch
            fetched = stub.FetchConsumerGroupAssignments(
                pb.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId="go", epoch=epoch), timeout=TIMEOUT
            )
            assert [(x.stream, list(x.partitions)) for x in fetched.assignments] == [(stream_name, [1])]
            cursor = stub.FetchCursor(
                pb.FetchCursorRequest(cursorId=cursor_id, stream=stream_name, partition=1), timeout=TIMEOUT
            ).offset
            go = _GoReader(
                stub,
                pb.SubscribeRequest(
                    stream=stream_name,
                    partition=1,
                    startPosition=pb.OFFSET,
                    startOffset=cursor + 1,
                    consumer=pb.Consumer(groupId=group, consumerId="go", groupEpoch=epoch),
                ),
            )
            _poll_until(a, {stream_name: [0]})  # a's next assignment check gives partition 1 up
            _publish(client, stream_name, "during")
            read_a += _read(a, 2)
            go.wait(2)
            # The Go-style member commits what it read and leaves, closing its subscription (Close in
            # go-liftbridge); a takes partition 1 back after its hand-over wait, from that position.
            stub.SetCursor(
                pb.SetCursorRequest(cursorId=cursor_id, stream=stream_name, partition=1, offset=go.read[-1][1]),
                timeout=TIMEOUT,
            )
            stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId=group, consumerId="go"), timeout=TIMEOUT)
            go.cancel()
            _poll_until(a, {stream_name: [0, 1]})
            _publish(client, stream_name, "after")
            read_a += _read(a, 4)
    assert go.read == [(1, 2), (1, 3)]
    every = [(p, o) for p in (0, 1) for o in range(6)]
    assert sorted(read_a + go.read) == every  # each message read once, by one member
