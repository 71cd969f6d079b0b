"""Error mapping: a failed call, a PublishAsync error or a refused ack becomes the typed error
(:mod:`.errors`) a caller sees; gRPC details never leak."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from . import diagnostics
from .effects import RpcFailure
from .errors import (
    AckTimeoutError,
    EncryptionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PermissionDeniedError,
    PublishError,
    ReadonlyPartitionError,
    RequestTimeoutError,
    ServerError,
    StreamExistsError,
)
from .types import Ack, AckError

_PUBLISH_METHODS = frozenset({"Publish", "PublishAsync", "PublishToSubject"})


def _what(stream: str | None, partition: int | None) -> str:
    if stream is None:
        return "the request"
    return f"stream {stream!r}" if partition is None else f"stream {stream!r} partition {partition}"


def _not_found(stream: str | None, partition: int | None, said: str, partition_named: bool) -> LiftbridgeError:
    if partition_named and partition is not None:
        return NoSuchPartitionError(
            f"{_what(stream, partition)} does not exist{said}; check the stream's partition count."
        )
    return NoSuchStreamError(f"{_what(stream, None)} does not exist{said}; create it first or check the name.")


def _incorrect_offset(what: str, said: str = "") -> IncorrectOffsetError:
    return IncorrectOffsetError(
        f"{what} refused the message: expected_offset is not the next offset{said}; fetch the partition's "
        "newest_offset and publish with newest_offset + 1."
    )


def map_rpc_error(
    method: str,
    failure: RpcFailure,
    *,
    stream: str | None = None,
    partition: int | None = None,
    attempts: int = 1,
    tried: Sequence[str] = (),
    timeout: float | None = None,
) -> LiftbridgeError:
    """Turn a failed call into the typed error a caller should see.

    The server's own message is quoted; the status code only chooses the class.

    :param timeout: the deadline the call had, in seconds, quoted in timeout errors.
    """
    code, said = failure.code, failure.details
    low = said.lower()
    what = _what(stream, partition)
    server = f' (server said: "{said}")' if said else ""
    within = f"within {timeout:g} s" if timeout is not None else "within the timeout"
    C = grpc.StatusCode
    if code == C.ALREADY_EXISTS:
        return StreamExistsError(f"{what} already exists{server}; choose another name or delete it first.")
    if code == C.NOT_FOUND:
        return _not_found(stream, partition, server, "partition" in low and "stream" not in low)
    if code == C.FAILED_PRECONDITION:
        if "pause" in low or ("commit log" in low and "closed" in low):
            # Liftbridge ends a subscription with FAILED_PRECONDITION "commit log was closed" only
            # when the partition is paused (its log is closed; server/api.go); an empty paused
            # partition answers a new Subscribe that way after the handshake.
            return PartitionPausedError(f"{what} is paused{server}; publish to it or subscribe with resume=True.")
        if "readonly" in low or "read-only" in low or (method in _PUBLISH_METHODS and "leader" not in low):
            return ReadonlyPartitionError(
                f"{what} is read-only{server}; it accepts no more messages (set_stream_readonly(..., readonly=False)"
                " to reopen it)."
            )
        return NotLeaderError(f"no leader found for {what}{server}; the cluster may be electing one: retry later.")
    if code == C.UNKNOWN and "offset" in low:
        return _incorrect_offset(what, server)
    if code == C.DEADLINE_EXCEEDED:
        if "deadline exceeded" in low:
            server = ""  # gRPC's own client-side text ("Stream removed (Deadline Exceeded)"), not the server's
        if method in ("Publish", "PublishToSubject"):
            return AckTimeoutError(
                f"no ack for the message to {what} {within}{server}; it may or may not be stored. Raise"
                " timeout=, or publish again only if a duplicate is acceptable."
            )
        return RequestTimeoutError(f"{method} on {what} did not finish {within}{server}; raise timeout=.")
    if code == C.RESOURCE_EXHAUSTED and "larger than max" in low:
        # gRPC's own message-size limit (client or server side), not a Liftbridge status.
        return MessageTooLargeError(
            f"{method} to {what} refused: the message is over gRPC's size limit{server}; split the record, or"
            " publish over NATS with a larger max_payload."
        )
    if code == C.UNAVAILABLE:
        return diagnostics.unavailable_error(method, said, attempts=attempts, tried=tried)
    if code == C.INTERNAL and "deadline exceeded" in low:
        # Liftbridge answers a SetCursor whose message was not committed on the cursors stream's
        # replicas within its own 5 s with INTERNAL and the Go context's words.
        return RequestTimeoutError(
            f"{method} on {what} timed out on the server{server}: the write was not committed in time (it may"
            " still be); repeating the call is safe."
        )
    if code == C.INTERNAL and diagnostics.is_cursors_disabled(said):
        return diagnostics.cursors_disabled_error(method, said)
    if code == C.INTERNAL and "segment has been closed" in low:
        # Liftbridge closes a paused partition's log, so a Subscribe to it fails at once with
        # INTERNAL "Failed to create stream reader: segment has been closed" (no handshake).
        return PartitionPausedError(f"{what} is paused{server}; publish to it or subscribe with resume=True.")
    if code == C.INVALID_ARGUMENT:
        return InvalidArgumentError(f"{method} on {what} refused an argument as invalid{server}; fix the argument.")
    if code in (C.PERMISSION_DENIED, C.UNAUTHENTICATED):
        return PermissionDeniedError(f"{method} on {what} was refused{server}; check credentials and permissions.")
    return ServerError(f"{method} on {what} failed{server}; check the broker's logs.")


def map_async_error(code: int, message: str, *, stream: str, partition: int) -> LiftbridgeError:
    """Map a PublishAsync ``asyncError`` to a typed error."""
    E = api_pb2.PublishAsyncError
    said = f' (server said: "{message}")' if message else ""
    what = _what(stream, partition)
    if code == E.NOT_FOUND:
        low = message.lower()
        return _not_found(stream, partition, said, "partition" in low and "stream" not in low)
    if code == E.READONLY:
        return ReadonlyPartitionError(f"{what} is read-only{said}; it accepts no more messages.")
    if code == E.INCORRECT_OFFSET:
        return _incorrect_offset(what, said)
    if code == E.BAD_REQUEST:
        return InvalidArgumentError(f"{what} refused the message as invalid{said}; fix the record.")
    if code == E.ENCRYPTION_FAILED:
        return EncryptionError(f"{what} could not encrypt the message{said}; check the broker's encryption keys.")
    if code == E.PERMISSION_DENIED:
        return PermissionDeniedError(f"publishing to {what} was refused{said}; check permissions.")
    return ServerError(f"publishing to {what} failed{said}; check the broker's logs.")


def check_ack(ack: Ack) -> Ack:
    """Return ``ack`` or raise the typed error for its ``ack_error``."""
    if ack.ack_error == AckError.OK:
        return ack
    what = _what(ack.stream, ack.partition)
    if ack.ack_error == AckError.INCORRECT_OFFSET:
        raise _incorrect_offset(what)
    if ack.ack_error == AckError.TOO_LARGE:
        raise MessageTooLargeError(f"{what} refused the message as too large; split it or raise the server's limit.")
    if ack.ack_error == AckError.ENCRYPTION:
        raise EncryptionError(f"{what} could not encrypt the message; check the broker's encryption keys.")
    raise ServerError(f"{what} refused the message for an unknown reason; check the broker's logs.")


def publish_error(
    acks: list[Ack | None], index: int | None, errors: dict[int, LiftbridgeError], why: str
) -> PublishError:
    """The :class:`PublishError` of a batch: how many records were acknowledged, and ``why``."""
    done = sum(1 for a in acks if a is not None)
    return PublishError(f"{done} of {len(acks)} records acknowledged; {why}", acks=acks, index=index, errors=errors)
