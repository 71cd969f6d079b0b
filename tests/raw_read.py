"""Read a partition as stored, with a bare gRPC stub: no decompression, headers as written (the
view of a reader that knows nothing of this client's compression)."""

from __future__ import annotations

import grpc

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc


def stored_messages(address: str, stream: str, partition: int = 0, timeout: float = 10.0) -> list[api_pb2.Message]:
    """Every message of ``stream``'s ``partition`` from offset 0 to the newest, as stored."""
    req = api_pb2.SubscribeRequest(
        stream=stream, partition=partition, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    out: list[api_pb2.Message] = []
    with grpc.insecure_channel(address) as channel:
        try:
            out.extend(m for m in api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=timeout) if m.ByteSize())
        except grpc.RpcError as err:  # the server ends the stream once the stop position is reached
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
    return out
