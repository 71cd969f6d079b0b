"""The shared operations driven step by step by a scripted answerer (see ``scripted.py``):
retry order, backoff, window and resubscription are checked exactly, with no network."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import AckPolicy, StartPosition, UnavailableError, _ops
from airflow_provider_liftbridge.client._core import ClientCore, RpcFailure
from airflow_provider_liftbridge.client._effects import END, Cancel, OpenStream, Read, Sleep, Unary, Write

from .scripted import Run, drive

UNAVAILABLE = RpcFailure(grpc.StatusCode.UNAVAILABLE, "down")


def core(**kw: Any) -> ClientCore:
    args = dict(timeout=5.0, max_retries=3, ack_policy=AckPolicy.LEADER, resubscribe_wait=30.0)
    args.update(kw)
    return ClientCore(["a:1", "b:2", "c:3"], **args)  # type: ignore[arg-type]


def metadata(leader: str = "b1", port: int = 2) -> api_pb2.FetchMetadataResponse:
    return api_pb2.FetchMetadataResponse(
        brokers=[api_pb2.Broker(id=leader, host="b", port=port)],
        streamMetadata=[
            api_pb2.StreamMetadata(
                name="s", subject="s", partitions={0: api_pb2.PartitionMetadata(id=0, leader=leader)}
            )
        ],
    )


def test_unary_cycles_brokers_with_growing_backoff_and_sticks_to_the_good_one() -> None:
    c = core()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            if e.address != "c:3":
                raise UNAVAILABLE
            return api_pb2.FetchCursorResponse(offset=7)
        return None

    run = drive(_ops.fetch_cursor(c, "id", "s", 0), answer)
    assert run.result == 7
    assert [e.address for e in run.effects if isinstance(e, Unary)] == ["a:1", "b:2", "c:3"]
    sleeps = [e.seconds for e in run.effects if isinstance(e, Sleep)]
    assert len(sleeps) == 2 and 0.025 <= sleeps[0] <= 0.05 and 0.05 <= sleeps[1] <= 0.1
    again = drive(_ops.fetch_cursor(c, "id", "s", 0), answer)
    assert [e.address for e in again.effects if isinstance(e, Unary)] == ["c:3"]  # sticky


def test_unary_gives_up_after_max_retries() -> None:
    c = core(max_retries=2)
    run = Run()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            raise UNAVAILABLE
        return None

    with pytest.raises(UnavailableError, match="3 attempt"):
        drive(_ops.fetch_cursor(c, "id", "s", 0), answer, run=run)
    assert len([e for e in run.effects if isinstance(e, Unary)]) == 3


def test_subscribe_resumes_from_last_offset_plus_one_on_the_new_leader() -> None:
    c = core()
    opened: list[Any] = []
    leader = {"id": "b1", "port": 2}
    streams: dict[int, list[Any]] = {}

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return metadata(leader["id"], leader["port"])
        if isinstance(e, OpenStream):
            opened.append((e.address, e.request))
            n = len(opened)
            if n == 1:
                streams[n] = [api_pb2.Message(), api_pb2.Message(offset=0), api_pb2.Message(offset=1), UNAVAILABLE]
            else:  # the new leader repeats offset 1 (must be dropped), then ends at a stop
                streams[n] = [api_pb2.Message(), api_pb2.Message(offset=1), api_pb2.Message(offset=2),
                              RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")]  # fmt: skip
            leader.update(id="b9", port=9)
            return n
        if isinstance(e, Read):
            item = streams[e.handle].pop(0)
            if isinstance(item, RpcFailure):
                raise item
            return item
        return None

    run = drive(_ops.subscribe(c, "s", start_at=StartPosition.EARLIEST), answer)
    assert [m.offset for m in run.emitted] == [0, 1, 2]
    (addr1, req1), (addr2, req2) = opened
    assert (addr1, req1.startPosition) == ("b:2", api_pb2.EARLIEST)
    assert (addr2, req2.startPosition, req2.startOffset) == ("b:9", api_pb2.OFFSET, 2)
    assert any(isinstance(e, Cancel) for e in run.effects)


def test_publish_many_keeps_at_most_window_in_flight_and_orders_acks() -> None:
    c = core()
    inflight: list[str] = []
    peak = 0

    def answer(e: Any) -> Any:
        nonlocal peak
        if isinstance(e, OpenStream):
            return "h"
        if isinstance(e, Write):
            inflight.append(e.request.correlationId)
            peak = max(peak, len(inflight))
            return None
        if isinstance(e, Read):
            if not inflight:
                return END
            cid = inflight.pop()  # answer the newest first: acks arrive out of order
            return api_pb2.PublishResponse(
                correlationId=cid, ack=api_pb2.Ack(stream="s", correlationId=cid, offset=int(cid.split("-")[1]))
            )
        return None

    run = drive(_ops.publish_many(c, "s", [b"x"] * 20, window=3), answer)
    assert peak == 3
    assert [a.offset for a in run.result] == list(range(20))


def test_subscribe_stops_reading_at_the_stop_offset_and_swallows_only_the_handshake() -> None:
    c = core()
    # After the handshake, offset 0 with an empty value is as empty on the wire as a handshake.
    script = [api_pb2.Message(), api_pb2.Message(offset=0), api_pb2.Message(offset=1),
              api_pb2.Message(offset=2), api_pb2.Message(offset=3)]  # fmt: skip

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return metadata()
        if isinstance(e, OpenStream):
            return "h"
        if isinstance(e, Read):
            return script.pop(0)
        return None

    run = drive(_ops.subscribe(c, "s", stop_at=2), answer)
    assert [(m.offset, m.value) for m in run.emitted] == [(0, b""), (1, b""), (2, b"")]
    assert [m.offset for m in script] == [3]  # nothing read past the stop offset
    assert len([e for e in run.effects if isinstance(e, OpenStream)]) == 1


def test_subscribe_ends_cleanly_when_the_server_closes_the_stream() -> None:
    c = core()
    script = [api_pb2.Message(), api_pb2.Message(offset=0), END]

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return metadata()
        if isinstance(e, OpenStream):
            return "h"
        if isinstance(e, Read):
            return script.pop(0)
        return None

    run = drive(_ops.subscribe(c, "s"), answer)
    assert [m.offset for m in run.emitted] == [0] and run.result is None and not script
