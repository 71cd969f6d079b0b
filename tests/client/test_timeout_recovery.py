"""What the NATS bulk path does with records whose acks never came (issue 24 point 3), judged
against what a real partition holds: a record stored whose ack was lost (a NATS node dying
between the broker and the client) counts as acknowledged and is not sent again; a record the
partition certainly does not hold is sent again, counted; and when another writer makes the
partition's contents unexplainable, nothing is sent again and the time-outs stand.

The acks are "lost" by building the batch's outcome as the engine reports a lost ack (no ack,
timed out) after publishing the records for real: losing a NATS ack on purpose needs a NATS node
killed at the right microsecond (``tests/reliability/test_nats_node_death.py`` does that, not
deterministically). Everything else is real: the dev server, its NATS server, the reads.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AckPolicy, Record
from airflow_provider_liftbridge.client.publishing.batch import NatsBatch
from airflow_provider_liftbridge.client.publishing.nats_engine import BulkOutcome
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.timeout_recovery import send_unstored_again

from .conftest import AsyncAsSync


@pytest.fixture
def client(make_client: Any, lb_address: str, nats_url: str) -> Any:
    """A sync or asyncio client (the check runs on either transport) with NATS."""
    return make_client(lb_address, nats_servers=[nats_url], timeout=30.0)


def _batch(stream: str, records: list[Record], before: int) -> NatsBatch:
    # The time-outs are made up (see _judge), so nothing here waits for them to pass; the bound is
    # what the check may take for its reads, and a check that cannot read in time keeps the
    # time-outs standing (right, but not what these tests look at). 3 s ran out at load 25 (a busy
    # run, 2 cores): a bound for a call that takes milliseconds, not a timer under test.
    options = PublishOptions(ack_policy=AckPolicy.LEADER, path="nats", timeout=30.0)
    return NatsBatch(
        items=records,
        parts=[0] * len(records),
        subjects=[stream] * len(records),
        ids=[uuid.uuid4().hex for _ in records],
        options=options,
        before={0: before},
        sent_ns=None,
    )


def _judge(client: Any, stream: str, batch: NatsBatch) -> BulkOutcome:
    """Every record of ``batch`` without its ack, judged as the bulk path judges a time-out."""
    n = len(batch.items)
    outcome = BulkOutcome(acks=[None] * n, timed_out=list(range(n)), sent=n)
    if isinstance(client, AsyncAsSync):
        client._call(client.inner._transport.run(send_unstored_again(client.inner._core, stream, outcome, batch)))
    else:
        client._transport.run(send_unstored_again(client._core, stream, outcome, batch))
    return outcome


def _stored(client: Any, stream: str) -> list[tuple[bytes | None, bytes]]:
    newest = client.fetch_partition_metadata(stream, 0).newest_offset
    return [(m.key, m.value) for m in client.subscribe(stream, start_at=0, stop_at=newest)] if newest >= 0 else []


def _records(n: int) -> list[Record]:
    # Two records share a value (different keys), and two are identical: matching goes by key,
    # value and headers, and one stored message answers for one record only.
    records = [Record(f"v{i}".encode(), key=f"k{i % 7}".encode(), headers={"h": b"x"}) for i in range(n)]
    records[3] = Record(b"v1", key=b"k9", headers={"h": b"x"})
    records[5] = records[4]
    return records


def test_records_stored_without_their_acks_count_as_acknowledged(
    client: Any, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_stream(stream_name, stream_name)
    records = _records(8)
    client.publish_many(stream_name, records, path="nats")
    caplog.set_level(logging.WARNING, logger="airflow_provider_liftbridge.client")

    outcome = _judge(client, stream_name, _batch(stream_name, records, before=-1))

    assert outcome.timed_out == []
    assert [a.offset for a in outcome.acks if a is not None] == list(range(8))
    assert outcome.resent == 0
    assert _stored(client, stream_name) == [(r.key, r.value) for r in records]  # nothing sent twice
    assert any("found stored" in r.getMessage() for r in caplog.records)
    assert not any("re-sen" in r.getMessage() for r in caplog.records)


def test_only_the_records_the_partition_lacks_are_sent_again(
    client: Any, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_stream(stream_name, stream_name)
    records = _records(8)
    client.publish_many(stream_name, records[:5], path="nats")  # the last three never arrived
    caplog.set_level(logging.WARNING, logger="airflow_provider_liftbridge.client")

    outcome = _judge(client, stream_name, _batch(stream_name, records, before=-1))

    assert outcome.timed_out == []
    assert outcome.resent == 3
    assert sorted(a.offset for a in outcome.acks if a is not None) == list(range(8))
    assert sorted(_stored(client, stream_name)) == sorted((r.key, r.value) for r in records)  # each once
    assert any("re-sending 3 record(s)" in r.getMessage() for r in caplog.records)


def test_another_writers_messages_leave_the_time_outs_standing(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    records = _records(8)
    client.publish_many(stream_name, [b"someone else", b"and again"], path="grpc")
    client.publish_many(stream_name, records[:5], path="nats")

    outcome = _judge(client, stream_name, _batch(stream_name, records, before=-1))

    # Five are found; the other three may or may not be stored for all the check can tell
    # (two messages are not this batch's): they stay timed out, nothing is sent again.
    assert outcome.timed_out == [5, 6, 7]
    assert [a.offset for a in outcome.acks[:5] if a is not None] == [2, 3, 4, 5, 6]
    assert outcome.resent == 0
    assert len(_stored(client, stream_name)) == 7
