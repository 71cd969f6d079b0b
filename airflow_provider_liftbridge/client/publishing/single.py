"""Publishing one message over gRPC (Publish, PublishToSubject), waiting for its ack."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from ..conversion import ack_from_pb
from ..effects import Op, Sleep
from ..error_mapping import check_ack
from ..errors import NoSuchPartitionError, NoSuchStreamError
from ..operations import choose_partition, missing_confirmed_op, unary
from ..partitioners import PartitionerFunc
from ..requests import build_publish, build_publish_to_subject
from ..routing import ClientCore
from ..types import Ack, AckPolicy

__all__ = ["ack_of", "publish", "publish_to_subject"]


def publish(
    core: ClientCore,
    stream: str,
    value: bytes,
    *,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    partition: int | None = None,
    partitioner: PartitionerFunc | None = None,
    ack_policy: AckPolicy | None = None,
    expected_offset: int | None = None,
    ack_inbox: str | None = None,
    correlation_id: str | None = None,
    timeout: float | None = None,
) -> Op[Ack | None]:
    """Publish one message and wait for its ack (``None`` with ``AckPolicy.NONE``).

    The partition is ``partition`` if given, else the ``partitioner``'s choice, else 0. A publish
    that meets UNAVAILABLE is retried on another broker: without ``expected_offset`` that makes it
    at-least-once (a retried message may be stored twice). A "no such stream" about a stream
    this client has seen in metadata is retried too (up to ``max_retries`` times, with backoff)
    until the metadata of all streams confirms it: a restarting cluster answers that for a
    second or two (see :mod:`..presence`). Run by ``LiftbridgeClient.publish``, which has this signature
    without ``core``.

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
    :raises ReadonlyPartitionError: the partition is read-only.
    :raises IncorrectOffsetError: ``expected_offset`` was refused (optimistic concurrency control).
    :raises AckTimeoutError: no ack within ``timeout`` (or the client's default).
    :raises UnavailableError: no broker could be reached.
    """
    policy = core.resolve_ack_policy(ack_policy)
    timeout = core.ack_wait(timeout, policy)
    chosen = yield from choose_partition(core, stream, key, value, partition, partitioner)
    request = build_publish(
        stream,
        value,
        partition=chosen,
        key=key,
        headers=headers,
        ack_policy=policy,
        expected_offset=expected_offset,
        ack_inbox=ack_inbox,
        correlation_id=correlation_id or uuid.uuid4().hex,
    )
    refused = 0
    until = core.clock() + timeout  # one deadline for the whole call, refusals included
    while True:
        try:
            response = yield from unary(
                core,
                "Publish",
                request,
                timeout=timeout,
                preferred=core.route(stream, chosen),
                stream=stream,
                partition=chosen,
                until=until,
            )
            return ack_of(response, policy)
        except (NoSuchStreamError, NoSuchPartitionError) as error:
            core.cache.forget(stream)  # a stale partition count may have chosen the partition
            # A stream seen before may be missing only because the cluster is restarting (presence.py).
            refused += 1
            backoff = core.retry_wait(refused, until) if stream in core.seen_streams else None
            if backoff is None:
                raise
            yield Sleep(backoff)
            if (yield from missing_confirmed_op(core, stream, chosen)):
                raise error from error.__cause__


def publish_to_subject(
    core: ClientCore,
    subject: str,
    value: bytes,
    *,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    ack_policy: AckPolicy | None = None,
    ack_inbox: str | None = None,
    correlation_id: str | None = None,
    timeout: float | None = None,
) -> Op[Ack | None]:
    """Publish one message to a NATS subject; every stream attached to it stores it. Returns the
    first ack (``None`` with ``AckPolicy.NONE``). Retried on UNAVAILABLE: at-least-once.

    :raises AckTimeoutError: no stream acknowledged within the timeout (also: no stream listens on
        the subject).
    :raises UnavailableError: no broker could be reached.
    """
    policy = core.resolve_ack_policy(ack_policy)
    request = build_publish_to_subject(
        subject,
        value,
        key=key,
        headers=headers,
        ack_policy=policy,
        ack_inbox=ack_inbox,
        correlation_id=correlation_id or uuid.uuid4().hex,
    )
    response = yield from unary(core, "PublishToSubject", request, timeout=timeout, stream=None)
    return ack_of(response, policy)


def ack_of(response: object, policy: AckPolicy) -> Ack | None:
    """The checked ack of a Publish/PublishToSubject response (``None`` when none was asked for).

    :raises LiftbridgeError: the ack reports an error (see :func:`~..error_mapping.check_ack`).
    """
    if policy == AckPolicy.NONE or not response.HasField("ack"):  # type: ignore[attr-defined]
        return None
    return check_ack(ack_from_pb(response.ack))  # type: ignore[attr-defined]
