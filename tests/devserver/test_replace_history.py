"""The dev cluster's test hook ``replace_history`` (a model of Liftbridge v1.9.0-72's wrong
truncation, docs/devserver.md "A replaced history"): a follower cuts its log after an offset,
committed records included, and leads at once; the other replicas follow its history."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, StartPosition, StopPosition
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer, DevServerError, DevServerProcess
from tests.margins import wait_until


def _check(server: DevServer | DevServerProcess, stream: str) -> None:
    with LiftbridgeClient(server.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream, stream, replication_factor=3)
        client.publish_many(stream, [b"r%d" % i for i in range(10)], ack_policy=AckPolicy.ALL)
        wait_until(lambda: client.fetch_partition_metadata(stream, 0).high_watermark == 9, 60.0, "committed")
        part = client.fetch_metadata([stream]).streams[stream].partitions[0]
        follower = next(r for r in part.replicas if r != part.leader)
        index = server.broker_ids.index(follower)
        with pytest.raises(DevServerError if isinstance(server, DevServerProcess) else ValueError):
            server.replace_history(stream, 0, server.broker_ids.index(part.leader), 3)  # the leader itself
        assert server.replace_history(stream, 0, index, 3) == 6
        info = client.fetch_partition_metadata(stream, 0)
        assert (info.leader, info.newest_offset, info.high_watermark) == (follower, 3, 3)
        client.publish(stream, b"new history", ack_policy=AckPolicy.ALL)
        stored = client.subscribe(stream, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
        assert [m.value for m in stored] == [b"r0", b"r1", b"r2", b"r3", b"new history"]


def test_a_follower_cuts_committed_records_and_leads(stream_name: str) -> None:
    with DevServer(brokers=3, timings=ClusterTimings.fast()) as server:
        _check(server, stream_name)


def test_the_hook_on_the_control_channel(stream_name: str) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="replace-history-") as data,
        DevServerProcess(Path(data), brokers=3, timings=ClusterTimings.fast()) as server,
    ):
        _check(server, stream_name)
