"""A failed ``publish_many`` with ack policy ALL names the acknowledged records the partition has
lost since (``AckedThenLostError``), not as acknowledged (issue 59; seed 59961 in
docs/reliability.md).

On Liftbridge v1.9.0-72 a follower cut to its lagging high watermark can be elected, and records
acknowledged with ALL are gone. The dev cluster models it with its test hook ``replace_history``
(docs/devserver.md, "A replaced history"). Here a call's first records are acknowledged and
committed; then its leader hangs (so the rest of the call times out and it raises) and, in the
first test, a follower cuts the log below some acknowledged offsets and leads. Before the check
those records were reported acknowledged.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from airflow_provider_liftbridge.client import (
    AckedThenLostError,
    AckPolicy,
    AsyncLiftbridgeClient,
    LiftbridgeClient,
    PublishError,
    ResendUnacked,
)
from airflow_provider_liftbridge.devserver import DevServer
from tests.margins import wait_until

pytestmark = [pytest.mark.timeout(300)]

RECORDS = 200_000  # far more than can be acknowledged before the strike lands
COMMITTED, KEEP_TO = 999, 499  # strike once offsets 0..COMMITTED are committed; the follower keeps 0..KEEP_TO


def _publish(addresses: list[str], stream: str, *, asynchronous: bool) -> None:
    """The call under test: RECORDS with ALL over gRPC, no re-sends, on the blocking or the
    asyncio client (both run the same operation). The client reads the metadata first, so that it
    sends to the leader (the broker the strike hangs), as a client that published before does."""
    values = [b"r%06d" % i for i in range(RECORDS)]
    options = {"path": "grpc", "ack_policy": AckPolicy.ALL, "timeout": 5.0, "resend": ResendUnacked(0)}
    if not asynchronous:
        with LiftbridgeClient(addresses, timeout=5.0, max_retries=8) as client:
            client.fetch_metadata([stream])
            client.publish_many(stream, values, **options)  # type: ignore[arg-type]
        return

    async def run() -> None:
        async with AsyncLiftbridgeClient(addresses, timeout=5.0, max_retries=8) as client:
            await client.fetch_metadata([stream])
            await client.publish_many(stream, values, **options)  # type: ignore[arg-type]

    asyncio.run(run())


def _struck_publish(
    cluster: DevServer, stream: str, *, replace: bool, asynchronous: bool = False
) -> tuple[PublishError, int | None]:
    """Publish (:func:`_publish`) while another thread, once the first COMMITTED + 1 records are
    committed, hangs the leader and (``replace``) has a follower cut the log after KEEP_TO and
    lead. Returns the call's error and how many records the cut removed."""
    with LiftbridgeClient(cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream, stream, replication_factor=3)
        part = client.fetch_metadata([stream]).streams[stream].partitions[0]
        leader = cluster.broker_ids.index(part.leader)
        follower = cluster.broker_ids.index(next(r for r in part.replicas if r != part.leader))
        cut: list[int] = []
        failures: list[BaseException] = []
        stalled = threading.Event()

        def strike() -> None:
            try:
                with LiftbridgeClient(cluster.addresses, timeout=5.0, max_retries=8) as looker:
                    wait_until(
                        lambda: looker.fetch_partition_metadata(stream, 0).high_watermark >= COMMITTED,
                        120.0,
                        "the call's first records committed",
                        interval=0.01,
                    )
                # The leader hangs first, so that nothing of the call reaches the new history.
                cluster.stall_broker(leader)
                stalled.set()
                if replace:
                    cut.append(cluster.replace_history(stream, 0, follower, KEEP_TO))
            except BaseException as exc:  # reported by the test below
                failures.append(exc)

        striker = threading.Thread(target=strike, name="strike")
        striker.start()
        try:
            with pytest.raises(PublishError) as raised:
                _publish(cluster.addresses, stream, asynchronous=asynchronous)
        finally:
            striker.join()
            if stalled.is_set():
                cluster.resume_broker(leader)
        assert not failures, f"the strike failed: {failures[0]!r}"
        return raised.value, (cut[0] if cut else None)


def _account(exc: PublishError) -> None:
    """Every record has an ack or an error, never both."""
    for i, ack in enumerate(exc.acks):
        assert (ack is None) == (i in exc.errors), f"record {i}: ack {ack}, error {exc.errors.get(i)!r}"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["blocking", "asyncio"])
def test_acked_records_the_partition_lost_are_reported_lost(
    fast_cluster: DevServer, stream_name: str, asynchronous: bool
) -> None:
    exc, cut = _struck_publish(fast_cluster, stream_name, replace=True, asynchronous=asynchronous)
    _account(exc)
    lost = {i: e for i, e in exc.errors.items() if isinstance(e, AckedThenLostError)}
    assert lost, f"no record reported lost: {exc}"
    # Record i was acknowledged at offset i (one producer, one partition): those above KEEP_TO
    # that were acknowledged are lost, those up to KEEP_TO stay acknowledged.
    assert all(e.offset > KEEP_TO and e.newest_offset == KEEP_TO and e.partition == 0 for e in lost.values())
    assert all(e.offset == i for i, e in lost.items())
    assert all(ack is not None and ack.offset <= KEEP_TO for ack in exc.acks[: KEEP_TO + 1])
    assert all(ack is None for ack in exc.acks[KEEP_TO + 1 :]), "an ack above the cut is still reported"
    assert min(lost) == KEEP_TO + 1 and len(lost) >= COMMITTED - KEEP_TO
    assert cut is not None and cut >= len(lost)
    assert "lost since" in str(exc) and "publish them again" in str(exc)


def test_nothing_lost_reports_nothing_lost(fast_cluster: DevServer, stream_name: str) -> None:
    exc, _ = _struck_publish(fast_cluster, stream_name, replace=False)
    _account(exc)
    assert not any(isinstance(e, AckedThenLostError) for e in exc.errors.values()), exc
    assert exc.acked > COMMITTED
    assert all(ack is not None and ack.offset == i for i, ack in enumerate(exc.acks[: exc.acked]))
