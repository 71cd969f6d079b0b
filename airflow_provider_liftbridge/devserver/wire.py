"""Building acks and PublishAsync responses: shared by the gRPC API and the NATS ingest."""

from __future__ import annotations

from airflow_provider_liftbridge._proto import api_pb2

from .state import Partition, varint

ACK_OK = api_pb2.Ack.OK
ACK_INCORRECT_OFFSET = api_pb2.Ack.INCORRECT_OFFSET


def build_ack(
    part: Partition,
    msg_subject: str,
    offset: int,
    ack_inbox: str,
    correlation_id: str,
    ack_policy: int,
    reception_ts: int,
    commit_ts: int,
    error: int = ACK_OK,
) -> api_pb2.Ack:
    """The ``Ack`` for a message of ``part`` (``partitionSubject`` is the stream's base subject)."""
    return api_pb2.Ack(
        stream=part.stream.name,
        partitionSubject=part.stream.subject,
        msgSubject=msg_subject,
        offset=offset,
        ackInbox=ack_inbox,
        correlationId=correlation_id,
        ackPolicy=ack_policy,  # type: ignore[arg-type]
        receptionTimestamp=reception_ts,
        commitTimestamp=commit_ts,
        ackError=error,  # type: ignore[arg-type]
    )


def publish_response_bytes(ack_bytes: bytes, correlation_id: str) -> bytes:
    """A serialized ``PublishResponse{ack, correlationId}`` around an already serialized ``Ack``.

    Built by hand because PublishAsync sends one per message; the layout is plain protobuf
    (field 1 length-delimited, field 3 string).
    """
    out = b"\x0a" + varint(len(ack_bytes)) + ack_bytes
    if correlation_id:
        cid = correlation_id.encode()
        out += b"\x1a" + varint(len(cid)) + cid
    return out


def async_error_bytes(correlation_id: str, code: int, message: str) -> bytes:
    """A serialized PublishAsync error response: correlation id, async error and an empty ack."""
    return api_pb2.PublishResponse(
        ack=api_pb2.Ack(),
        asyncError=api_pb2.PublishAsyncError(code=code, message=message),  # type: ignore[arg-type]
        correlationId=correlation_id,
    ).SerializeToString()
