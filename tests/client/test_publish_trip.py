"""A batch's trip from ``BatchPublisher.send``: one operation on the transport, the first batch
included (the route is opened inside ``send_batch``), on both paths (issue 56)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishOptions


@pytest.mark.parametrize("path", ["grpc", "nats"])
def test_each_batch_is_one_operation_on_the_transport(
    path: str, nats_url: str, lb_address: str, stream_name: str
) -> None:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        client.create_stream(stream_name, stream_name)
        publisher = client.batch_publisher(stream_name, PublishOptions(path=path))  # type: ignore[arg-type]
        run = publisher._run
        operations: list[str] = []

        def spy(op: Any) -> Any:  # spy only: the real transport runs the operation
            operations.append(op.__name__)
            return run(op)

        publisher._run = spy  # type: ignore[method-assign]
        first = publisher.send([b"a", b"b"])
        second = publisher.send([b"c"])
        assert [ack.offset for ack in first + second] == [0, 1, 2]
        # Before issue 56 the first batch was two: open_route, then send_batch.
        assert operations == ["send_batch", "send_batch"]
        assert publisher.path == path  # opened by the first batch: asking runs nothing more
        assert operations == ["send_batch", "send_batch"]
