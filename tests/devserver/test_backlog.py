"""A slow subscriber on a large backlog, read with plain grpcio stubs on a default channel.

Regression: the dev server once served gRPC through its own HTTP/2 layer, which overran the
client's flow-control window here ("frame of size ... overflows local window") — see ADR 4.
It now serves gRPC on the ``h2`` library (ADR 5); test_flow_control.py covers smaller windows.
"""

from __future__ import annotations

import time

import grpc

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc
from airflow_provider_liftbridge.client import LiftbridgeClient


def test_slow_subscriber_reads_a_large_backlog_to_the_end(lb_address: str, nats_url: str, stream_name: str) -> None:
    total = 30_000
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"x" * 100] * total, window=1024)
    offsets = []
    with grpc.insecure_channel(lb_address) as channel:
        stream = api_pb2_grpc.APIStub(channel).Subscribe(
            api_pb2.SubscribeRequest(
                stream=stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
            )
        )
        try:
            for msg in stream:
                if msg.value:
                    offsets.append(msg.offset)
                    if len(offsets) % 10_000 == 1:
                        time.sleep(0.2)  # let the server's sends pile up against the client's window
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
    assert offsets == list(range(total))
