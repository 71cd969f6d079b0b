"""The frames that come back on a NATS publish's ack inbox, each turned into a settlement of its
record: the record's index (from the correlation id) and its :class:`~..types.Ack`, or the typed
error of a refusal. A frame that is not an ack is logged and passed over; an ack for no record of
the call (another call's, or a made-up id) is passed over.

:func:`read_acks_plain` says what the reading is, with the codec's and the conversion's own
functions, a frame at a time; :func:`read_acks`, the NATS engine's, gives the same settlements
in a fraction of the time. ``tests/client/test_ack_inbox.py`` holds the two equal on every kind
of frame.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import AckDecoder, EnvelopeError, unmarshal_ack
from airflow_provider_liftbridge.nats_adapter import AckHandler

from ..conversion import ack_from_pb
from ..error_mapping import check_ack
from ..errors import LiftbridgeError
from ..types import Ack, AckError, AckPolicy
from .correlation import CorrelationIds

__all__ = ["Settle", "read_acks", "read_acks_plain"]

log = logging.getLogger(__name__)

#: Settles record ``i`` with its ack, or with its error (:meth:`.window.SendWindow.settle`).
Settle = Callable[[int, "Ack | None", "LiftbridgeError | None"], object]


def read_acks_plain(ids: CorrelationIds, settle: Settle) -> AckHandler:
    """The reader of an ack inbox, written plainly: each frame through :func:`~...codec.unmarshal_ack`,
    ``ids.index_of``, :func:`~..conversion.ack_from_pb` and :func:`~..error_mapping.check_ack`,
    and the result to ``settle``. The reference :func:`read_acks` is held to."""

    def read(payloads: list[bytes]) -> None:
        for data in payloads:
            try:
                pb = unmarshal_ack(data)
            except EnvelopeError as exc:
                _not_an_ack(exc)
                continue
            i = ids.index_of(pb.correlationId)
            if i >= 0:
                _settle_plainly(settle, i, pb)

    return read


def read_acks(ids: CorrelationIds, settle: Settle) -> AckHandler:
    """The reader of an ack inbox that the NATS engine uses: what :func:`read_acks_plain` does,
    at the cost it has on the bulk path (tens of thousands of acks a second, the largest part of
    the client's CPU per message after the frames).

    Why it is long and written the way it is (measured, ``bench/RESULTS.md``): one reused
    protobuf per frame (:class:`~...codec.AckDecoder`); the index parsed out of a generated id
    in line (``ids.index_of`` for other ids); a partition worked out once per subject; and an
    accepted ack built on :class:`_UnfrozenAck` with plain attribute stores and then made an
    :class:`~..types.Ack` by ``__class__`` assignment (a fraction of the cost of the frozen slots'
    setters, the largest item after parsing). A refusal (an ack error) is settled plainly. Where
    the class assignment does not work, this is :func:`read_acks_plain`.
    """
    if not _UNFREEZE_WORKS:
        return read_acks_plain(ids, settle)
    n, decode = len(ids), AckDecoder().decode
    index_of, own, prefix, plen = ids.index_of, bool(ids.own), ids.prefix, len(ids.prefix)
    new, unfrozen, frozen = object.__new__, _UnfrozenAck, Ack
    policies, leader, ok = {p.value: p for p in AckPolicy}, AckPolicy.LEADER, AckError.OK
    partitions: dict[str, tuple[str, int]] = {}  # msg subject: (partition subject, partition)

    def read(payloads: list[bytes]) -> None:
        for data in payloads:
            try:
                pb = decode(data)
            except EnvelopeError as exc:
                _not_an_ack(exc)
                continue
            cid = pb.correlationId
            if own or not cid.startswith(prefix):
                i = index_of(cid)
            else:  # ids.index_of(cid) for a generated id, in line
                tail = cid[plen:]
                i = int(tail) if tail.isdigit() and tail.isascii() else -1
                if i >= n:
                    continue
            if i < 0:
                continue
            if pb.ackError:
                _settle_plainly(settle, i, pb)
                continue
            ack: Any = new(unfrozen)
            ms = ack.msg_subject = pb.msgSubject
            ps = ack.partition_subject = pb.partitionSubject
            known = partitions.get(ms)
            if known is None or known[0] != ps:
                known = partitions[ms] = (ps, ack_from_pb(pb).partition)
            ack.partition = known[1]
            ack.stream = pb.stream
            ack.offset = pb.offset
            ack.ack_inbox = pb.ackInbox
            ack.correlation_id = cid
            ack.ack_policy = policies.get(pb.ackPolicy, leader)
            ack.reception_timestamp = pb.receptionTimestamp
            ack.commit_timestamp = pb.commitTimestamp
            ack.ack_error = ok
            ack.__class__ = frozen
            settle(i, ack, None)

    return read


def _settle_plainly(settle: Settle, i: int, pb: api_pb2.Ack) -> None:
    ack = ack_from_pb(pb)
    try:
        check_ack(ack)
    except LiftbridgeError as exc:
        settle(i, None, exc)
        return
    settle(i, ack, None)


def _not_an_ack(exc: EnvelopeError) -> None:
    log.warning("ignoring a frame on the ack inbox that is not an ack: %s", exc)


class _UnfrozenAck:
    """Same slots, in the same order, as :class:`~..types.Ack`, without the frozen
    ``__setattr__``: :func:`read_acks` fills an ack in here with plain attribute stores, then
    makes it an ``Ack`` by ``__class__`` assignment (Python allows it between classes of the same
    slot layout)."""

    __slots__ = tuple(f.name for f in fields(Ack))


def _unfreeze_works() -> bool:
    """Whether an :class:`_UnfrozenAck` can become an :class:`~..types.Ack` (checked once at
    import; :func:`read_acks` is the plain reader if a future ``Ack`` changes its layout)."""
    try:
        probe: Any = object.__new__(_UnfrozenAck)
        for f in fields(Ack):
            setattr(probe, f.name, None)
        probe.__class__ = Ack
    except TypeError:
        return False
    return type(probe) is Ack and all(getattr(probe, f.name) is None for f in fields(Ack))


_UNFREEZE_WORKS = _unfreeze_works()
