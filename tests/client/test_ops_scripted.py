"""The shared operations driven step by step by a scripted answerer (see ``scripted.py``):
retry order, backoff, window and resubscription are checked exactly, with no network."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import (
    AckPolicy,
    CursorsDisabledError,
    NoSuchStreamError,
    NotLeaderError,
    PublishError,
    RequestTimeoutError,
    StartPosition,
    UnavailableError,
    UnsettledCursorError,
    consumer,
    cursors,
    operations,
)
from airflow_provider_liftbridge.client.consumer import GroupMember
from airflow_provider_liftbridge.client.effects import END, Cancel, OpenStream, Read, RpcFailure, Sleep, Unary, Write
from airflow_provider_liftbridge.client.publishing import grpc_engine
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import DEFAULT_RESEND
from airflow_provider_liftbridge.client.routing import ClientCore
from airflow_provider_liftbridge.client.settings import ConnectionSettings
from airflow_provider_liftbridge.client.subscription import subscribe

from .scripted import Run, VirtualClock, drive

UNAVAILABLE = RpcFailure(grpc.StatusCode.UNAVAILABLE, "down")


def core(**kw: Any) -> ClientCore:
    """A core on a :class:`VirtualClock` (pass it to ``drive`` where retries run out of time)."""
    args = dict(brokers=("a:1", "b:2", "c:3"), timeout=5.0, max_retries=3, ack_policy=AckPolicy.LEADER)
    args.update(kw)
    c = ClientCore(ConnectionSettings(**args))  # type: ignore[arg-type]
    c.clock = VirtualClock()
    return c


def slept(run: Run) -> list[float]:
    return [e.seconds for e in run.effects if isinstance(e, Sleep)]


def metadata(leader: str = "b1", port: int = 2) -> api_pb2.FetchMetadataResponse:
    return api_pb2.FetchMetadataResponse(
        brokers=[api_pb2.Broker(id=leader, host="b", port=port)],
        streamMetadata=[
            api_pb2.StreamMetadata(
                name="s", subject="s", partitions={0: api_pb2.PartitionMetadata(id=0, leader=leader)}
            )
        ],
    )


def without_cursors_stream(c: ClientCore) -> ClientCore:
    """A core that has just seen metadata without a cursors stream: cursor calls go straight to
    any broker (these tests use them as plain idempotent unary calls)."""
    c.cursors_absent_since = time.monotonic()
    return c


def test_unary_cycles_brokers_with_growing_backoff_and_sticks_to_the_good_one() -> None:
    c = without_cursors_stream(core())

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            if e.address != "c:3":
                raise UNAVAILABLE
            return api_pb2.FetchCursorResponse(offset=7)
        return None

    run = drive(cursors.fetch_cursor(c, "id", "s", 0), answer)
    assert run.result == 7
    assert [e.address for e in run.effects if isinstance(e, Unary)] == ["a:1", "b:2", "c:3"]
    sleeps = [e.seconds for e in run.effects if isinstance(e, Sleep)]
    assert len(sleeps) == 2 and 0.025 <= sleeps[0] <= 0.05 and 0.05 <= sleeps[1] <= 0.1
    again = drive(cursors.fetch_cursor(c, "id", "s", 0), answer)
    assert [e.address for e in again.effects if isinstance(e, Unary)] == ["c:3"]  # sticky


def test_unary_retries_an_unavailable_cluster_for_its_timeout_then_gives_up() -> None:
    # A cluster whose brokers are all restarting: the call keeps trying, with growing backoff,
    # past max_retries for as long as its timeout (5 s) allows, and not longer.
    c = without_cursors_stream(core(max_retries=2, backoff_max=1.0))
    c.mark_good("a:1")  # the cluster answered before: it may be restarting
    run = Run()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            raise UNAVAILABLE
        return None

    with pytest.raises(UnavailableError, match="no broker reachable") as raised:
        drive(cursors.fetch_cursor(c, "id", "s", 0), answer, run=run, clock=c.clock)
    attempts = len([e for e in run.effects if isinstance(e, Unary)])
    waits = slept(run)
    assert attempts > 3 and len(waits) == attempts - 1 and f"{attempts} attempt" in str(raised.value)
    assert 4.0 <= sum(waits) < 5.0  # the timeout bounds the waiting; the last backoff would pass it
    assert max(waits) <= 1.0  # backoff_max caps each wait


def test_a_cluster_never_reached_fails_after_max_retries() -> None:
    # No broker has ever answered this client: more likely a wrong address than a restart.
    c = without_cursors_stream(core(max_retries=2))
    run = Run()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            raise UNAVAILABLE
        return None

    with pytest.raises(UnavailableError, match="3 attempt"):
        drive(cursors.fetch_cursor(c, "id", "s", 0), answer, run=run, clock=c.clock)
    assert len([e for e in run.effects if isinstance(e, Unary)]) == 3


def test_with_max_retries_0_a_call_is_tried_once() -> None:
    c = without_cursors_stream(core(max_retries=0))
    c.mark_good("a:1")
    run = Run()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            raise UNAVAILABLE
        return None

    with pytest.raises(UnavailableError, match="1 attempt"):
        drive(cursors.fetch_cursor(c, "id", "s", 0), answer, run=run, clock=c.clock)
    assert len([e for e in run.effects if isinstance(e, Unary)]) == 1 and not slept(run)


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

    run = drive(subscribe(c, "s", start_at=StartPosition.EARLIEST), answer)
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

    run = drive(grpc_engine.send_over_grpc(c, "s", [b"x"] * 20, PublishOptions(window=3)), answer)
    assert peak == 3
    assert [a.offset for a in run.result] == list(range(20))


def outage_answers(c: ClientCore, down: list[tuple[float, float]]) -> Callable[[Any], Any]:
    """A broker that is unreachable during each ``(start, end)`` of ``down`` (seconds on ``c``'s
    virtual clock from now: calls and reads fail UNAVAILABLE) and otherwise acknowledges every
    record of a PublishAsync stream, each ack taking 0.1 s."""
    t0 = c.clock()
    written: list[str] = []

    def is_down() -> bool:
        return any(t0 + a <= c.clock() < t0 + b for a, b in down)

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):  # the metadata a lost connection refreshes
            if is_down():
                raise UNAVAILABLE
            return metadata()
        if isinstance(e, OpenStream):  # lazy, as gRPC's: a broker that is down fails the first read
            written.clear()
            return "h"
        if isinstance(e, Write):
            written.append(e.request.correlationId)
            return None
        if isinstance(e, Read):
            c.clock.advance(0.1)  # type: ignore[attr-defined]
            if is_down():
                raise UNAVAILABLE
            cid = written.pop(0)
            return api_pb2.PublishResponse(correlationId=cid, ack=api_pb2.Ack(stream="s", correlationId=cid))
        return None

    return answer


def reached_core() -> ClientCore:
    """A core whose cluster answered before (so an outage may be an election), two retries."""
    c = core(max_retries=2, backoff_max=1.0)
    c.mark_good("a:1")
    return c


def test_publish_many_waits_out_an_outage_for_its_timeout_not_for_the_retry_count() -> None:
    # An election of 3 s: two retries with backoff (max_retries=2) used to give up after ~0.15 s.
    c = reached_core()
    t0 = c.clock()
    options = PublishOptions(resend=DEFAULT_RESEND)
    run = drive(
        grpc_engine.send_over_grpc(c, "s", [b"x"] * 10, options), outage_answers(c, [(0.0, 3.0)]), clock=c.clock
    )
    assert len(run.result) == 10 and all(a is not None for a in run.result)
    assert 3.0 <= c.clock() - t0 < 5.0 and len(slept(run)) > 3
    # The records were handed over twice, not once per failed reconnect: the default policy's
    # two re-sends are not spent on a broker that was not there.
    assert len([e for e in run.effects if isinstance(e, Write)]) == 20


def test_publish_many_gives_up_on_an_outage_after_its_timeout_naming_every_record() -> None:
    c = reached_core()
    run = Run()
    t0 = c.clock()
    with pytest.raises(PublishError) as raised:
        drive(grpc_engine.send_over_grpc(c, "s", [b"x"] * 10), outage_answers(c, [(0.0, 60.0)]), run=run, clock=c.clock)
    # The timeout (5 s) from the first failure (the first read, 0.1 s in) bounds the waiting.
    assert 4.0 <= c.clock() - t0 <= 5.1
    err = raised.value
    assert err.acked == 0 and isinstance(err.__cause__, UnavailableError)
    assert set(err.errors) == set(range(10))  # every record named


def test_publish_many_gets_a_whole_budget_for_each_outage_of_a_long_batch() -> None:
    # Two outages of 3.5 s with acks between them: more than one timeout (5 s) in all, but
    # each within it. One record in flight at a time, so the second outage cuts the batch.
    c = reached_core()
    t0 = c.clock()
    answer = outage_answers(c, [(0.0, 3.0), (4.5, 8.0)])  # the gap outlasts one backoff (<= 1 s): acks come
    options = PublishOptions(window=1, resend=DEFAULT_RESEND)
    run = drive(grpc_engine.send_over_grpc(c, "s", [b"x"] * 40, options), answer, clock=c.clock)
    assert len(run.result) == 40 and all(a is not None for a in run.result)
    assert c.clock() - t0 > 8.0  # 4 s of acks: the batch was still going when the second outage came


def test_a_group_call_waits_out_an_unavailable_cluster_for_the_timeout() -> None:
    c = reached_core()
    t0 = c.clock()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            if c.clock() < t0 + 3.0:
                raise UNAVAILABLE
            return api_pb2.JoinConsumerGroupResponse(coordinator="b1", epoch=4)
        return None

    member = GroupMember("g", ["s"], consumer_id="m")
    run = drive(consumer.join(c, member), answer, clock=c.clock)
    assert (member.coordinator, member.epoch) == ("b1", 4) and sum(slept(run)) >= 3.0


def test_a_group_call_gives_up_on_an_unavailable_cluster_after_the_timeout() -> None:
    c = reached_core()
    run = Run()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            raise UNAVAILABLE
        return None

    with pytest.raises(UnavailableError, match=r"JoinConsumerGroup failed: no broker reachable after \d+ attempt"):
        drive(consumer.join(c, GroupMember("g", ["s"], consumer_id="m")), answer, run=run, clock=c.clock)
    assert 4.0 <= sum(slept(run)) < 5.0


def subscription_answers(script: list[Any]) -> Callable[[Any], Any]:
    """Answers for a subscription: metadata for unary calls, then ``script``'s items, in order, as reads."""

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return metadata()
        if isinstance(e, OpenStream):
            return "h"
        if isinstance(e, Read):
            return script.pop(0)
        return None

    return answer


def test_subscribe_stops_reading_at_the_stop_offset_and_swallows_only_the_handshake() -> None:
    c = core()
    # After the handshake, offset 0 with an empty value is as empty on the wire as a handshake.
    script = [api_pb2.Message(), api_pb2.Message(offset=0), api_pb2.Message(offset=1),
              api_pb2.Message(offset=2), api_pb2.Message(offset=3)]  # fmt: skip

    run = drive(subscribe(c, "s", stop_at=2), subscription_answers(script))
    assert [(m.offset, m.value) for m in run.emitted] == [(0, b""), (1, b""), (2, b"")]
    assert [m.offset for m in script] == [3]  # nothing read past the stop offset
    assert len([e for e in run.effects if isinstance(e, OpenStream)]) == 1


def test_subscribe_ends_cleanly_when_the_server_closes_the_stream() -> None:
    c = core()
    script = [api_pb2.Message(), api_pb2.Message(offset=0), END]

    run = drive(subscribe(c, "s"), subscription_answers(script))
    assert [m.offset for m in run.emitted] == [0] and run.result is None and not script


# --- cursor routing ------------------------------------------------------------------------------

ADDRESSES = {"b1": "a:1", "b2": "b:2", "b3": "c:3"}


def cursors_metadata(leaders: list[str]) -> api_pb2.FetchMetadataResponse:
    """Metadata with the three seed brokers and a cursors stream whose partition i is led by leaders[i]."""
    return api_pb2.FetchMetadataResponse(
        brokers=[api_pb2.Broker(id=b, host=a.split(":")[0], port=int(a.split(":")[1])) for b, a in ADDRESSES.items()],
        streamMetadata=[
            api_pb2.StreamMetadata(
                name="__cursors",
                subject="__cursors",
                partitions={i: api_pb2.PartitionMetadata(id=i, leader=b) for i, b in enumerate(leaders)},
            )
        ],
    )


def cursors_partition_metadata(e: Any, hw: int = 5, newest: int = 5) -> api_pb2.FetchPartitionMetadataResponse:
    """What the leader of the cursors partition ``e`` asks about answers: committed to ``hw`` of
    ``newest`` (settled by default)."""
    leader = next(b for b, a in ADDRESSES.items() if a == e.address)
    return api_pb2.FetchPartitionMetadataResponse(
        metadata=api_pb2.PartitionMetadata(id=e.request.partition, leader=leader, highWatermark=hw, newestOffset=newest)
    )


def owner(cursor_id: str, stream: str, partition: int, partitions: int) -> int:
    # The Go client's rule: CRC-32 (IEEE) of "id,stream,partition", modulo the partition count.
    return zlib.crc32(f"{cursor_id},{stream},{partition}".encode()) % partitions


def test_cursor_calls_go_to_the_leader_of_the_owning_cursors_partition() -> None:
    c = core()
    leaders = ["b1", "b2", "b3"]
    fetched: list[Any] = []

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            fetched.append(list(e.request.streams))
            return cursors_metadata(leaders)
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            return cursors_partition_metadata(e)
        if isinstance(e, Unary):
            return api_pb2.FetchCursorResponse(offset=3) if e.method == "FetchCursor" else api_pb2.SetCursorResponse()
        return None

    cases = [("reader", "orders", 0), ("reader", "orders", 1), ("x", "s", 2), ("job-7", "events", 0)]
    owners = {owner(*cur, 3) for cur in cases}
    assert len(owners) >= 2  # the cases below reach more than one partition
    for cur in cases:
        fetch = drive(cursors.fetch_cursor(c, *cur), answer)
        put = drive(cursors.set_cursor(c, *cur, 5), answer)
        expected = ADDRESSES[leaders[owner(*cur, 3)]]
        assert fetch.result == 3
        assert [
            (e.method, e.address) for e in fetch.effects if isinstance(e, Unary) and e.method != "FetchMetadata"
        ] == [
            ("FetchPartitionMetadata", expected),  # the owning partition settled, asked of its leader
            ("FetchCursor", expected),
        ]
        assert [e.address for e in put.effects if isinstance(e, Unary) and e.method == "SetCursor"] == [expected]
    assert fetched == [["__cursors"]]  # looked up once, then cached


def test_a_cursor_call_refused_by_a_former_leader_is_rerouted_after_a_refresh() -> None:
    c = core()
    cur = ("reader", "orders", 0)
    part = owner(*cur, 3)
    leaders = ["b1", "b2", "b3"]
    moved = {"b1": "b2", "b2": "b3", "b3": "b1"}[leaders[part]]

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(leaders)
        if isinstance(e, Unary):
            if e.address != ADDRESSES[moved]:
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
            if e.method == "FetchPartitionMetadata":
                return cursors_partition_metadata(e)
            return api_pb2.FetchCursorResponse(offset=9)
        return None

    drive(operations.fetch_metadata(c, ["__cursors"]), answer)  # the cache still names the old leader
    leaders[part] = moved  # leadership moves before the call
    run = drive(cursors.fetch_cursor(c, *cur), answer)
    assert run.result == 9
    calls = [(e.method, e.address) for e in run.effects if isinstance(e, Unary)]
    assert calls[0][0] == "FetchPartitionMetadata" and calls[0][1] != ADDRESSES[moved]  # the settle check, refused
    assert ("FetchMetadata", calls[1][1]) == calls[1]
    assert calls[-2:] == [("FetchPartitionMetadata", ADDRESSES[moved]), ("FetchCursor", ADDRESSES[moved])]


def test_a_cursor_is_read_only_once_its_partition_has_committed_what_its_leader_held() -> None:
    # Issue 47: a cursors leader restarted from its high-watermark checkpoint (or newly elected)
    # reports a high watermark below messages already committed; Liftbridge answers a FetchCursor
    # then from that point and caches the answer. The read waits until the leader has committed
    # what it held when first asked, and no longer: later cursor writes by others do not hold it up.
    c = core()
    settles_at = c.clock() + 6.0

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(["b1", "b1", "b1"])
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            grown = int(c.clock() - 1000.0)  # others keep writing cursors: the log end keeps moving
            hw = 152 + grown if c.clock() >= settles_at else 122
            return cursors_partition_metadata(e, hw=hw, newest=152 + grown + 1)
        if isinstance(e, Unary):
            assert c.clock() >= settles_at, "FetchCursor sent before the partition settled"
            return api_pb2.FetchCursorResponse(offset=2900)
        return None

    run = drive(cursors.fetch_cursor(c, "reader", "s", 0), answer, clock=c.clock)
    assert run.result == 2900
    assert 6.0 <= sum(slept(run)) < 8.0  # backoff capped at 1 s: read within a second of settling


def test_a_cursor_read_gives_up_naming_the_partition_when_it_never_settles() -> None:
    c = core()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(["b1", "b1", "b1"])
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            return cursors_partition_metadata(e, hw=10, newest=12)  # an ISR member missing: nothing commits
        if isinstance(e, Unary):
            raise AssertionError(f"{e.method} sent although the partition never settled")
        return None

    run = Run()
    with pytest.raises(UnsettledCursorError, match=r"__cursors partition \d \(b1\) has committed up to offset 10 of"):
        drive(cursors.fetch_cursor(c, "reader", "s", 0), answer, run=run, clock=c.clock)
    assert cursors.CURSORS_SETTLE_WAIT - 1.0 <= sum(slept(run)) <= cursors.CURSORS_SETTLE_WAIT


def test_a_cursor_of_a_paused_cursors_partition_is_read_without_waiting() -> None:
    # An idle __cursors partition auto-pauses (cursors.stream.auto.pause.time, 1 min): its leader
    # refuses FetchPartitionMetadata with a non-leader's words; its log was closed cleanly, so its
    # high watermark is current, and FetchCursor (which resumes it) goes ahead.
    c = core()
    listed = cursors_metadata(["b1", "b1", "b1"])
    for part in listed.streamMetadata[0].partitions.values():
        part.paused = True

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return listed
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
        return api_pb2.FetchCursorResponse(offset=41) if isinstance(e, Unary) else None

    run = drive(cursors.fetch_cursor(c, "reader", "s", 0), answer, clock=c.clock)
    assert run.result == 41 and not slept(run)


def test_a_cursor_call_gives_up_when_no_leader_accepts_it_within_its_timeout() -> None:
    c = core(max_retries=2)

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(["b1", "b1", "b1"])
        if isinstance(e, Unary):
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
        return None

    run = Run()
    with pytest.raises(NotLeaderError):
        drive(cursors.set_cursor(c, "id", "s", 0, 1), answer, run=run, clock=c.clock)
    assert len([e for e in run.effects if isinstance(e, Unary) and e.method == "SetCursor"]) > 3
    assert 3.0 <= sum(slept(run)) < 5.0  # waited for a leader up to the 5 s timeout, not 2 retries


def test_a_set_cursor_whose_commit_never_comes_ends_one_attempt_after_its_timeout() -> None:
    # Seed 5006 of the fault campaign: every SetCursor attempt waited its whole deadline and the
    # server answered INTERNAL "context deadline exceeded" (Liftbridge's words when the cursor's
    # message is not committed in time); each call made max_retries + 1 such attempts, 45 s for a
    # 5 s timeout. None may start once the call's timeout has passed.
    c = core(max_retries=8)
    c.mark_good("a:1")
    started = c.clock()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(["b1", "b1", "b1"])
        if isinstance(e, Unary):
            c.clock.advance(e.timeout * 0.98)  # type: ignore[attr-defined]  # the server answers just in time
            raise RpcFailure(grpc.StatusCode.INTERNAL, "context deadline exceeded")
        return None

    run = Run()
    with pytest.raises(RequestTimeoutError, match="timed out on the server"):
        drive(cursors.set_cursor(c, "id", "s", 0, 1), answer, run=run, clock=c.clock)
    attempts = [e for e in run.effects if isinstance(e, Unary) and e.method == "SetCursor"]
    assert len(attempts) == 2  # the first ran into the 5 s timeout; the retry started before it was over
    assert c.clock() - started <= 2 * 5.0 + c.retry.backoff_max


def test_a_cursor_call_outlasts_an_election_longer_than_its_retry_count() -> None:
    # After a full restart no broker leads the cursors partition for a while (here 3 s of the
    # virtual clock: past what 5 retries with backoff used to wait, ~1.5 s); the call waits it out.
    c = core(max_retries=5)
    elected_at = c.clock() + 3.0

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return cursors_metadata(["b1", "b1", "b1"])
        if isinstance(e, Unary):
            if c.clock() < elected_at:
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "Server not leader for cursors partition 0")
            if e.method == "FetchPartitionMetadata":
                return cursors_partition_metadata(e)
            return api_pb2.FetchCursorResponse(offset=12)
        return None

    run = drive(cursors.fetch_cursor(c, "reader", "s", 0), answer, clock=c.clock)
    assert run.result == 12
    assert len([e for e in run.effects if isinstance(e, Unary) and e.method == "FetchPartitionMetadata"]) > 6


@pytest.mark.parametrize("listed", [True, False], ids=["cluster-with-streams", "empty-cluster"])
def test_a_cursor_call_fails_when_cursors_are_disabled(listed: bool) -> None:
    """A cluster that lists streams but no cursors stream has cursors off: at once. One that
    lists no stream at all may be in the first moment of a full restart: believed after the
    client's retries (an empty cluster with cursors off is rare; a restart is not)."""
    c = core()

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            empty = api_pb2.FetchMetadataResponse(brokers=[api_pb2.Broker(id="b1", host="a", port=1)])
            return metadata() if listed else empty
        if isinstance(e, Unary):
            raise RpcFailure(grpc.StatusCode.INTERNAL, "Cursors stream does not exist")
        return None

    run = Run()
    with pytest.raises(CursorsDisabledError):
        drive(cursors.fetch_cursor(c, "id", "s", 0), answer, run=run, clock=c.clock)
    calls = len([e for e in run.effects if isinstance(e, Unary) and e.method == "FetchCursor"])
    if listed:
        assert calls == 1 and not slept(run)
    else:
        assert calls == c.retry.max_retries + 1 and len(slept(run)) == c.retry.max_retries


def test_a_leader_call_on_a_stream_never_seen_fails_at_once_and_a_seen_one_waits_for_its_leader() -> None:
    c = core()
    listed = {"s": False}

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            # Right after a full restart the cluster lists brokers and no streams for a moment.
            return metadata() if listed["s"] or c.clock() > 1002.5 else api_pb2.FetchMetadataResponse()
        if isinstance(e, Unary):
            return api_pb2.FetchPartitionMetadataResponse(metadata=api_pb2.PartitionMetadata(id=0, leader="b1"))
        return None

    run = Run()
    with pytest.raises(NoSuchStreamError):
        drive(operations.fetch_partition_metadata(c, "never", 0), answer, run=run, clock=c.clock)
    assert not slept(run)
    c.seen_streams.update(["s"])  # listed by an earlier answer
    run = drive(operations.fetch_partition_metadata(c, "s", 0), answer, clock=c.clock)
    assert run.result.leader == "b1" and sum(slept(run)) >= 2.0


def test_without_a_cursors_stream_cursor_calls_go_to_any_broker_and_metadata_is_asked_again_later() -> None:
    c = core()
    methods: list[str] = []

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            methods.append(e.method)
            if e.method == "FetchMetadata":
                return api_pb2.FetchMetadataResponse(brokers=[api_pb2.Broker(id="b1", host="a", port=1)])
            return api_pb2.FetchCursorResponse(offset=-1)
        return None

    assert drive(cursors.fetch_cursor(c, "id", "s", 0), answer).result == -1
    assert drive(cursors.fetch_cursor(c, "id", "s", 0), answer).result == -1
    assert methods == ["FetchMetadata", "FetchCursor", "FetchCursor"]  # absence remembered
    assert c.cursors_absent_since is not None
    c.cursors_absent_since -= 31  # later on, the client looks again (a cursors stream may exist now)
    drive(cursors.fetch_cursor(c, "id", "s", 0), answer)
    assert methods[3:] == ["FetchMetadata", "FetchCursor"]


def test_a_read_that_a_stalled_broker_does_not_answer_in_time_is_asked_of_the_next_one() -> None:
    c = without_cursors_stream(core())
    stalled = RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            if e.address == "a:1":
                raise stalled  # stopped (SIGSTOP): the call waits until its deadline
            return api_pb2.FetchCursorResponse(offset=4)
        return None

    run = drive(cursors.fetch_cursor(c, "id", "s", 0), answer)
    assert run.result == 4
    assert [e.address for e in run.effects if isinstance(e, Unary)] == ["a:1", "b:2"]
    assert not any(isinstance(e, Sleep) for e in run.effects)  # no backoff: the deadline was the wait

    lone = without_cursors_stream(core(brokers=("a:1",)))
    with pytest.raises(RequestTimeoutError):
        drive(cursors.fetch_cursor(lone, "id", "s", 0), answer)  # every broker was asked once


def test_a_cursors_leader_missing_from_the_broker_list_is_found_by_asking_who_answers_for_it() -> None:
    # Right after a restart the metadata can name a leader whose address this client has not
    # been told (it lists only brokers that answered): the broker answering the partition's
    # metadata is its leader (only the leader does), and the cursor is read there.
    c = core()
    listed = cursors_metadata(["b9", "b9", "b9"])  # a leader id the broker list does not have

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return listed
        if isinstance(e, Unary) and e.address != ADDRESSES["b3"]:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            return cursors_partition_metadata(e)
        return api_pb2.FetchCursorResponse(offset=8) if isinstance(e, Unary) else None

    run = drive(cursors.fetch_cursor(c, "reader", "s", 0), answer, clock=c.clock)
    assert run.result == 8
    reads = [e.address for e in run.effects if isinstance(e, Unary) and e.method == "FetchCursor"]
    assert reads == [ADDRESSES["b3"]]
