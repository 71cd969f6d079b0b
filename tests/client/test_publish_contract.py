"""The publish contract (issue 36, ``client/publishing/contract.py``): a publishing call accounts
for every record, an ack or a typed error naming it, or it raises; a short list of acks is never
success.

A publisher that drops records is made here on purpose: the engine's result is wrapped so that it
loses acks without an error (an outcome with ``None`` in place of an ack, or a shorter list), as
a future bug in the engine would. That wrapping is the only stand-in; the dev server, its NATS
server and both clients are real. Then every publisher built on the engine must raise:
``publish_many`` (blocking and asyncio, NATS and gRPC), the batch publisher, and exactly-once
publishing, which reads the stream back instead of counting a record it has no ack for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    AckPolicy,
    LiftbridgeClient,
    MessageTooLargeError,
    NotSentError,
    PublishError,
    PublishOptions,
    Record,
    StartPosition,
    StopPosition,
    UnaccountedRecordError,
)
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher, ExactlyOncePublishError
from airflow_provider_liftbridge.client.publishing import batch as batch_module
from airflow_provider_liftbridge.client.publishing import grpc_engine

DROPPED = (3, 4, 5)


@pytest.fixture
def dropping_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both engines lose records silently: the NATS engine forgets the acks of records 3-5 (no
    error, no time-out), the gRPC pipeline returns its acks without the last three."""
    nats_engine = batch_module.send_over_nats

    async def forgetful(*args: Any, **kwargs: Any) -> Any:
        out = await nats_engine(*args, **kwargs)
        for i in DROPPED:
            if i < len(out.acks):
                out.acks[i] = None
        return out

    pipeline = grpc_engine._pipeline

    def short(*args: Any, **kwargs: Any) -> Any:
        acks = yield from pipeline(*args, **kwargs)
        return acks[: -len(DROPPED)]

    monkeypatch.setattr(batch_module, "send_over_nats", forgetful)
    monkeypatch.setattr(grpc_engine, "_pipeline", short)


def _stored(client: LiftbridgeClient, stream: str) -> list[bytes]:
    if client.fetch_partition_metadata(stream, 0).high_watermark < 0:
        return []
    reader = client.subscribe(stream, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
    return [m.value for m in reader]


@pytest.mark.usefixtures("dropping_engines")
@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_an_engine_that_drops_records_makes_publish_many_raise(
    make_client: Any, lb_address: str, nats_url: str, stream_name: str, path: str
) -> None:
    client = make_client(lb_address, nats_servers=[nats_url], timeout=5.0)
    client.create_stream(stream_name, stream_name)
    records = [b"r%d" % i for i in range(10)]
    with pytest.raises(PublishError, match="unaccounted for") as caught:
        client.publish_many(stream_name, records, path=path)
    err = caught.value
    assert len(err.acks) == len(records)
    unaccounted = sorted(i for i, e in err.errors.items() if isinstance(e, UnaccountedRecordError))
    if path == "nats":
        # The acks that did come still line up with their records; the lost ones are named.
        assert unaccounted == list(DROPPED)
        assert all(err.acks[i] is not None for i in range(10) if i not in DROPPED)
    else:
        # A shorter list cannot be matched to records any more: none of it counts as proof.
        assert unaccounted == list(range(10)) and err.acked == 0
    assert "may or may not be stored" in str(err.errors[unaccounted[0]])


@pytest.mark.usefixtures("dropping_engines")
def test_the_batch_publisher_raises_and_counts_only_what_was_acknowledged(
    lb_address: str, nats_url: str, stream_name: str
) -> None:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as client:
        client.create_stream(stream_name, stream_name)
        publisher = client.batch_publisher(stream_name, PublishOptions(path="nats"))
        with pytest.raises(PublishError) as caught:
            publisher.send_all([b"r%d" % i for i in range(20)], batch=10)
    assert caught.value.start == 0 and caught.value.acked == 10 - len(DROPPED)


def test_exactly_once_does_not_count_a_record_without_its_ack(
    dropping_engines: None, monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str, stream_name: str
) -> None:
    """Exactly-once gets the contract's error, which says the engine is at fault: it stops loudly
    (no resumption hides an engine bug), counting as written only the acknowledged records. A
    retry with the same producer id, the engine mended, completes without a duplicate: it finds
    the dropped records in the stream (the engine only forgot their acks) and skips them."""
    records = [b"r%d" % i for i in range(10)]
    options = PublishOptions(path="nats", ack_policy=AckPolicy.ALL)
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as client:
        client.create_stream(stream_name, stream_name)
        with pytest.raises(ExactlyOncePublishError, match="UnaccountedRecordError") as caught:
            ExactlyOncePublisher(client, stream_name, "contract/eo", options=options).publish(records)
        assert caught.value.result.written == 10 - len(DROPPED)
        monkeypatch.undo()
        result = ExactlyOncePublisher(client, stream_name, "contract/eo", options=options).publish(records)
        stored = _stored(client, stream_name)
    assert (result.written, result.skipped) == (0, len(records))
    assert sorted(stored) == sorted(records)


def test_a_failed_call_names_every_record(make_client: Any, lb_address: str, nats_url: str, stream_name: str) -> None:
    """No stand-in: record 3 is too large for the NATS server, so the call stops there. The
    records before it are acknowledged, record 3 is named MessageTooLargeError, and the ones the
    engine never sent are named NotSentError (and are not stored)."""
    client = make_client(lb_address, nats_servers=[nats_url], timeout=5.0)
    client.create_stream(stream_name, stream_name)
    huge = b"x" * (2 << 20)  # over nats-server's default max_payload of 1 MiB
    records = [Record(b"a"), Record(b"b"), Record(b"c"), Record(huge), Record(b"e"), Record(b"f")]
    with pytest.raises(PublishError) as caught:
        client.publish_many(stream_name, records, path="nats", window=2)
    err = caught.value
    assert err.index == 3 and err.acked == 3
    assert isinstance(err.errors[3], MessageTooLargeError)
    assert {i: type(e) for i, e in err.errors.items() if i != 3} == {4: NotSentError, 5: NotSentError}
    with LiftbridgeClient(lb_address) as reader:
        assert _stored(reader, stream_name) == [b"a", b"b", b"c"]


@pytest.fixture
def sync_client(lb_address: str, nats_url: str) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as client:
        yield client


def test_with_ack_policy_none_every_record_is_sent_or_the_call_raises(
    sync_client: LiftbridgeClient, stream_name: str
) -> None:
    """Without acks the contract is that every record was handed over: [] back, and all stored."""
    sync_client.create_stream(stream_name, stream_name)
    records = [b"n%d" % i for i in range(50)]
    assert sync_client.publish_many(stream_name, records, path="nats", ack_policy=AckPolicy.NONE) == []
    assert sync_client.publish_many(stream_name, [b"last"], ack_policy=AckPolicy.ALL)[0].offset == 50
    assert _stored(sync_client, stream_name) == [*records, b"last"]
