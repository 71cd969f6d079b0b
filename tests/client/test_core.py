"""The sans-I/O core: request building, conversions, positions and error mapping."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import (
    AckError,
    AckPolicy,
    AckTimeoutError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeError,
    Message,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PermissionDeniedError,
    ReadonlyPartitionError,
    RequestTimeoutError,
    ServerError,
    StartPosition,
    StopPosition,
    StreamExistsError,
    UnavailableError,
)
from airflow_provider_liftbridge.client.conversion import ack_from_pb, metadata_from_pb
from airflow_provider_liftbridge.client.effects import RpcFailure
from airflow_provider_liftbridge.client.error_mapping import check_ack, map_async_error, map_rpc_error
from airflow_provider_liftbridge.client.requests import build_create_stream, build_publish, start_fields, stop_fields
from airflow_provider_liftbridge.client.retry import RetryPolicy
from airflow_provider_liftbridge.client.settings import parse_brokers
from airflow_provider_liftbridge.client.stream_options import StreamOptions
from airflow_provider_liftbridge.client.subscription import SubscriptionState

C = grpc.StatusCode
NONE = dict.fromkeys(
    [
        "group",
        "retention_max_bytes",
        "retention_max_messages",
        "retention_max_age",
        "cleaner_interval",
        "segment_max_bytes",
        "segment_max_age",
        "compact_enabled",
        "compact_max_goroutines",
        "auto_pause_time",
        "auto_pause_disable_if_subscribers",
        "min_isr",
        "optimistic_concurrency_control",
        "encryption",
    ]
)


def test_parse_brokers_accepts_the_three_forms() -> None:
    assert parse_brokers("a:1") == ["a:1"]
    assert parse_brokers("a:1, b:2,a:1") == ["a:1", "b:2"]
    assert parse_brokers(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]


@pytest.mark.parametrize("bad", ["", "nohost", "h:", ":9", "h:p"])
def test_parse_brokers_refuses_malformed(bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="host:port|no broker"):
        parse_brokers(bad)


def test_create_stream_leaves_unset_options_unset() -> None:
    req = build_create_stream("subj", "name", StreamOptions(partitions=3, replication_factor=1, **NONE))
    assert (req.subject, req.name, req.partitions, req.replicationFactor) == ("subj", "name", 3, 1)
    for field in ("retentionMaxAge", "retentionMaxBytes", "compactEnabled", "minIsr", "optimisticConcurrencyControl"):
        assert not req.HasField(field)


def test_create_stream_sends_durations_in_milliseconds() -> None:
    opts = dict(NONE)
    opts.update(
        retention_max_age=timedelta(hours=1),
        cleaner_interval=timedelta(seconds=30),
        segment_max_age=timedelta(minutes=5, milliseconds=7),
        auto_pause_time=timedelta(microseconds=1500),
        retention_max_bytes=1024,
        min_isr=2,
        compact_enabled=False,
        optimistic_concurrency_control=True,
    )
    req = build_create_stream("s", "n", StreamOptions(partitions=1, replication_factor=-1, **opts))
    assert req.retentionMaxAge.value == 3_600_000
    assert req.cleanerInterval.value == 30_000
    assert req.segmentMaxAge.value == 300_007
    assert req.autoPauseTime.value == 1  # truncated like Go's Duration.Milliseconds()
    assert req.retentionMaxBytes.value == 1024 and req.minIsr.value == 2
    assert req.HasField("compactEnabled") and req.compactEnabled.value is False
    assert req.optimisticConcurrencyControl.value is True
    assert req.replicationFactor == -1


def test_create_stream_refuses_a_number_for_a_duration() -> None:
    opts = dict(NONE, retention_max_age=3600)
    with pytest.raises(InvalidArgumentError, match="retention_max_age must be a datetime.timedelta"):
        build_create_stream("s", "n", StreamOptions(partitions=1, replication_factor=1, **opts))


@pytest.mark.parametrize(("subject", "name"), [("", "n"), ("s", "")])
def test_create_stream_refuses_empty_names(subject: str, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        build_create_stream(subject, name, StreamOptions(partitions=1, replication_factor=1, **NONE))


def test_publish_request_defaults_expected_offset_to_minus_one() -> None:
    req = build_publish(
        "s", b"v", partition=2, key=None, headers={"h": b"1"}, ack_policy=AckPolicy.ALL,
        expected_offset=None, ack_inbox=None, correlation_id="c",
    )  # fmt: skip
    assert (req.partition, req.key, req.value, req.expectedOffset) == (2, b"", b"v", -1)
    assert req.ackPolicy == api_pb2.ALL and dict(req.headers) == {"h": b"1"} and req.correlationId == "c"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value": "text"}, "value must be bytes"),
        ({"partition": -1}, "partition must be an int >= 0"),
        ({"headers": {"h": "text"}}, "headers must map str to bytes"),
    ],
)
def test_publish_request_refuses_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = dict(
        value=b"v", partition=0, key=None, headers=None, ack_policy=AckPolicy.LEADER,
        expected_offset=None, ack_inbox=None, correlation_id=None,
    )  # fmt: skip
    args.update(kwargs)
    value = args.pop("value")
    with pytest.raises(InvalidArgumentError, match=match):
        build_publish("s", value, **args)  # type: ignore[arg-type]


def test_start_positions() -> None:
    assert start_fields(StartPosition.EARLIEST) == {"startPosition": api_pb2.EARLIEST}
    assert start_fields(StartPosition.LATEST) == {"startPosition": api_pb2.LATEST}
    assert start_fields(StartPosition.NEW_ONLY) == {"startPosition": api_pb2.NEW_ONLY}
    assert start_fields(42) == {"startPosition": api_pb2.OFFSET, "startOffset": 42}
    when = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    ns = 1704164645_678901_000
    assert start_fields(when) == {"startPosition": api_pb2.TIMESTAMP, "startTimestamp": ns}
    assert start_fields(timedelta(seconds=5), now=when) == {
        "startPosition": api_pb2.TIMESTAMP,
        "startTimestamp": ns - 5_000_000_000,
    }


@pytest.mark.parametrize("bad", [True, "earliest", 1.5, datetime(2024, 1, 1)])
def test_bad_start_positions_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="start_at"):
        start_fields(bad)  # type: ignore[arg-type]


def test_stop_positions() -> None:
    assert stop_fields(None) == {"stopPosition": api_pb2.STOP_ON_CANCEL}
    assert stop_fields(StopPosition.LATEST) == {"stopPosition": api_pb2.STOP_LATEST}
    assert stop_fields(9) == {"stopPosition": api_pb2.STOP_OFFSET, "stopOffset": 9}
    when = datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert stop_fields(when) == {"stopPosition": api_pb2.STOP_TIMESTAMP, "stopTimestamp": 1_000_000_000}
    with pytest.raises(InvalidArgumentError, match="stop_at"):
        stop_fields(-1)


def test_subscription_resumes_after_last_delivered_offset_and_drops_repeats() -> None:
    st = SubscriptionState("s", 1, StartPosition.LATEST, 5, read_isr_replica=True, resume=True)
    first = st.request()
    assert (first.startPosition, first.stopPosition, first.stopOffset) == (api_pb2.LATEST, api_pb2.STOP_OFFSET, 5)
    assert first.readISRReplica and first.resume and first.partition == 1
    assert st.on_message(api_pb2.Message(), first=True) is None  # the handshake
    msg = st.on_message(
        api_pb2.Message(offset=3, value=b"x", key=b"k", headers={"a": b"b"}, stream="s", partition=1), first=False
    )
    assert msg is not None and (msg.offset, msg.value, msg.key, dict(msg.headers)) == (3, b"x", b"k", {"a": b"b"})
    again = st.request()
    assert (again.startPosition, again.startOffset, again.stopOffset) == (api_pb2.OFFSET, 4, 5)
    assert st.on_message(api_pb2.Message(offset=3, value=b"x"), first=False) is None  # a repeat is dropped
    assert not st.finished
    st.on_message(api_pb2.Message(offset=5, value=b"y"), first=False)
    assert st.finished


def test_subscribed_message_conversion_matches_the_dataclass_constructor() -> None:
    st = SubscriptionState("s", 2, StartPosition.EARLIEST, None, read_isr_replica=False, resume=False)
    pb = api_pb2.Message(
        offset=7, key=b"k", value=b"v", timestamp=123, subject="s.2", replySubject="r", headers={"a": b"1", "b": b""}
    )
    msg = st.take(pb)
    expected = Message("s", 2, 7, b"k", b"v", 123, "s.2", "r", {"a": b"1", "b": b""})
    assert msg == expected and expected == msg
    one = st.take(api_pb2.Message(offset=8, headers={"a": b"1"}))
    assert repr(one) == repr(Message("s", 2, 8, None, b"", 0, "", "", {"a": b"1"}))
    headers = msg.headers  # type: ignore[union-attr]
    assert (headers["a"], headers.get("b"), headers.get("c", b"-")) == (b"1", b"", b"-")
    assert "a" in headers and "c" not in headers
    assert (len(headers), sorted(headers), dict(headers.items())) == (2, ["a", "b"], {"a": b"1", "b": b""})
    assert headers == {"a": b"1", "b": b""} and headers != {"a": b"1"}
    with pytest.raises(KeyError):
        headers["c"]
    with pytest.raises(TypeError):
        headers["a"] = b"2"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.offset = 8  # type: ignore[misc, union-attr]
    bare = st.take(api_pb2.Message(offset=9))
    assert bare is not None and (bare.key, bare.value, dict(bare.headers), bare.headers) == (None, b"", {}, {})
    assert not st.done and st.last_offset == 9


def test_messages_with_only_the_server_headers_share_one_mapping() -> None:
    st = SubscriptionState("s", 0, StartPosition.EARLIEST, None, read_isr_replica=False, resume=False)

    def pb(offset: int, subject: str = "s", reply: str = "", **headers: bytes) -> api_pb2.Message:
        server = {"subject": subject.encode(), "reply": reply.encode()}
        return api_pb2.Message(offset=offset, subject=subject, replySubject=reply, headers=server | headers)

    first, second = st.take(pb(0)), st.take(pb(1))
    assert first is not None and second is not None
    assert first.headers == {"subject": b"s", "reply": b""} and first.headers is second.headers
    with pytest.raises(TypeError):
        first.headers["subject"] = b"x"  # type: ignore[index]
    # Another subject or reply subject: checked again, then shared from there on.
    other, again = st.take(pb(2, "s.x", "inbox")), st.take(pb(3, "s.x", "inbox"))
    assert other is not None and again is not None
    assert other.headers == {"subject": b"s.x", "reply": b"inbox"} and other.headers is again.headers
    # Headers of the publisher's own, or two that are not the server's: a mapping of their own.
    own = st.take(pb(4, a=b"1"))
    assert own is not None and own.headers == {"subject": b"s", "reply": b"", "a": b"1"}
    fresh = SubscriptionState("s", 0, StartPosition.EARLIEST, None, read_isr_replica=False, resume=False)
    odd = fresh.take(api_pb2.Message(offset=0, subject="s", headers={"a": b"1", "b": b""}))
    assert odd is not None and odd.headers == {"a": b"1", "b": b""}
    mismatched = fresh.take(api_pb2.Message(offset=1, subject="s", headers={"subject": b"t", "reply": b""}))
    assert mismatched is not None and mismatched.headers == {"subject": b"t", "reply": b""}
    assert dict(fresh.take(pb(2)).headers) == {"subject": b"s", "reply": b""}  # type: ignore[union-attr]


def test_subscription_is_done_at_the_stop_offset_and_skips_what_it_delivered() -> None:
    st = SubscriptionState("s", 0, StartPosition.EARLIEST, 3, read_isr_replica=False, resume=False)
    taken = [st.take(api_pb2.Message(offset=o)) for o in (1, 1, 0, 2)]  # a lagging replica repeats itself
    assert [m.offset if m else None for m in taken] == [1, None, None, 2] and not st.done
    last = st.take(api_pb2.Message(offset=3))
    assert last is not None and last.offset == 3 and st.done and st.finished


def test_ack_conversion_parses_the_partition_from_the_subject() -> None:
    pb = api_pb2.Ack(
        stream="s", partitionSubject="subj", msgSubject="subj.3", offset=7, ackInbox="in", correlationId="c",
        ackPolicy=api_pb2.ALL, receptionTimestamp=1, commitTimestamp=2,
    )  # fmt: skip
    ack = ack_from_pb(pb)
    assert (ack.partition, ack.offset, ack.ack_policy, ack.ack_error) == (3, 7, AckPolicy.ALL, AckError.OK)
    assert ack_from_pb(api_pb2.Ack(partitionSubject="a.b", msgSubject="a.b")).partition == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        ack.offset = 8  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (api_pb2.Ack.INCORRECT_OFFSET, IncorrectOffsetError),
        (api_pb2.Ack.TOO_LARGE, MessageTooLargeError),
        (api_pb2.Ack.UNKNOWN, ServerError),
    ],
)
def test_ack_errors_raise_typed_errors(error: int, cls: type[LiftbridgeError]) -> None:
    with pytest.raises(cls):
        check_ack(ack_from_pb(api_pb2.Ack(stream="s", ackError=error)))  # type: ignore[arg-type]


def test_metadata_conversion_drops_unknown_streams() -> None:
    pb = api_pb2.FetchMetadataResponse(
        brokers=[api_pb2.Broker(id="b0", host="h", port=1, partitionCount=2, leaderCount=1)],
        streamMetadata=[
            api_pb2.StreamMetadata(
                name="s", subject="subj", creationTimestamp=5,
                partitions={0: api_pb2.PartitionMetadata(id=0, leader="b0", isr=["b0"], highWatermark=-1,
                                                         newestOffset=-1)},
            ),
            api_pb2.StreamMetadata(name="gone", error=api_pb2.StreamMetadata.UNKNOWN_STREAM),
        ],
    )  # fmt: skip
    md = metadata_from_pb(pb)
    assert [b.address for b in md.brokers] == ["h:1"]
    assert list(md.streams) == ["s"]
    part = md.streams["s"].partitions[0]
    assert (part.leader, part.isr, part.high_watermark, part.newest_offset) == ("b0", ("b0",), -1, -1)


# Every row of the status table in liftbridge-semantics.md that a call can raise.
STATUS_TABLE = [
    ("CreateStream", C.ALREADY_EXISTS, "stream already exists", StreamExistsError),
    ("CreateStream", C.INVALID_ARGUMENT, "Invalid replicationFactor 3, cluster size 1", InvalidArgumentError),
    ("DeleteStream", C.NOT_FOUND, "stream does not exist", NoSuchStreamError),
    ("PauseStream", C.NOT_FOUND, "no such stream", NoSuchStreamError),
    ("Publish", C.NOT_FOUND, "no such stream: s", NoSuchStreamError),
    ("Publish", C.NOT_FOUND, "no such partition: 9", NoSuchPartitionError),
    ("Publish", C.FAILED_PRECONDITION, "partition is readonly", ReadonlyPartitionError),
    ("Publish", C.FAILED_PRECONDITION, "", ReadonlyPartitionError),
    ("Publish", C.UNKNOWN, "incorrect expected offset", IncorrectOffsetError),
    ("Publish", C.DEADLINE_EXCEEDED, "", AckTimeoutError),
    ("Subscribe", C.FAILED_PRECONDITION, "Server not partition leader", NotLeaderError),
    ("Subscribe", C.FAILED_PRECONDITION, "partition is paused", PartitionPausedError),
    # Liftbridge v1.9 on a paused partition: the call fails at once (its log is closed).
    ("Subscribe", C.INTERNAL, "Failed to create stream reader: segment has been closed", PartitionPausedError),
    # ... and an empty paused partition (or one paused under a subscriber) ends it after the handshake.
    ("Subscribe", C.FAILED_PRECONDITION, "commit log was closed", PartitionPausedError),
    ("FetchPartitionMetadata", C.NOT_FOUND, "partition not found", NoSuchPartitionError),
    ("FetchMetadata", C.DEADLINE_EXCEEDED, "", RequestTimeoutError),
    ("FetchMetadata", C.UNAVAILABLE, "connection refused", UnavailableError),
    ("SetCursor", C.INVALID_ARGUMENT, "cursorId cannot be empty", InvalidArgumentError),
    ("SetCursor", C.PERMISSION_DENIED, "", PermissionDeniedError),
    ("SetCursor", C.INTERNAL, "boom", ServerError),
]


@pytest.mark.parametrize(("method", "code", "said", "cls"), STATUS_TABLE)
def test_status_codes_map_to_typed_errors(method: str, code: grpc.StatusCode, said: str, cls: type) -> None:
    err = map_rpc_error(method, RpcFailure(code, said), stream="s", partition=9)
    assert type(err) is cls
    text = str(err)
    assert "s" in text and ";" in text  # names the target, then what to do
    assert "StatusCode" not in text and "grpc" not in text.lower()


def test_unavailable_lists_the_brokers_tried_without_grpc_details() -> None:
    err = map_rpc_error(
        "FetchMetadata", RpcFailure(C.UNAVAILABLE, "failed to connect to all addresses; ipv4:..."), attempts=3,
        tried=["a:1", "b:2"],
    )  # fmt: skip
    assert "a:1, b:2" in str(err) and "3 attempt" in str(err) and "ipv4" not in str(err)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (api_pb2.PublishAsyncError.NOT_FOUND, NoSuchStreamError),
        (api_pb2.PublishAsyncError.READONLY, ReadonlyPartitionError),
        (api_pb2.PublishAsyncError.INCORRECT_OFFSET, IncorrectOffsetError),
        (api_pb2.PublishAsyncError.BAD_REQUEST, InvalidArgumentError),
        (api_pb2.PublishAsyncError.PERMISSION_DENIED, PermissionDeniedError),
        (api_pb2.PublishAsyncError.INTERNAL, ServerError),
    ],
)
def test_async_errors_map_to_typed_errors(code: int, cls: type) -> None:
    assert type(map_async_error(code, "x", stream="s", partition=0)) is cls


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    import random

    policy = RetryPolicy(max_retries=5, backoff_base=0.1, backoff_max=0.5)
    rng = random.Random(1)
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5)]:
        waits = [policy.backoff(attempt, rng) for _ in range(50)]
        assert all(cap / 2 <= w <= cap for w in waits)
        assert len(set(waits)) > 1  # jittered


def test_timeout_errors_quote_the_deadline() -> None:

    failure = RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    error = map_rpc_error("FetchMetadata", failure, timeout=2.5)
    assert isinstance(error, RequestTimeoutError) and "within 2.5 s" in str(error)
    ack_error = map_rpc_error("Publish", failure, stream="s", partition=0, timeout=0.25)
    assert isinstance(ack_error, AckTimeoutError) and "within 0.25 s" in str(ack_error)
