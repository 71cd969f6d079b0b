"""A broker cut off from its peers while its clients still reach it: a minority broker (cluster
fault hook; docs/devserver.md, "A broker cut off").

A Liftbridge broker talks to its peers only through NATS: the metadata (Raft) log, the
followers' fetches and the leaders' ISR requests all travel as NATS messages. So a broker whose
NATS connection goes silent, or whose NATS node is cut from the others, is cut off from every
peer. Its gRPC port still answers the clients that reach it. What follows, as on Liftbridge:

- **its peers move on**: its followers' fetches fail, so as a partition leader it is replaced after
  ``replica_max_leader_timeout`` by a reachable ISR member (the metadata leader on the majority
  side decides; the old one learns nothing). As a follower it falls out of the ISR after
  ``replica_max_lag_time``. As the metadata leader it is replaced after ``metadata_election_timeout``;
- **it commits nothing**: its followers fetch nothing from it, and it cannot shrink its ISR (an ISR
  change is a metadata change, which it cannot send to the metadata leader), so its high watermark
  stands still and ALL acks never come. Those it owed are dropped when the majority elects a new
  leader; the publisher times out;
- **it answers from what it last knew** (:func:`view_leader`, :func:`view_metadata`): it still
  names itself leader of what it led, lists the ISR it knew, serves Subscribe on those partitions
  up to its own high watermark, and knows no stream created after the cut;
- **what it takes**: cut from NATS (``"nats"``), nothing: a gRPC publish sent to it goes into its
  NATS connection and no leader ever takes it (lost here; see docs/devserver.md for what the
  dev server simplifies); cut from its peers only (``"peers"``: its NATS node cut from the
  others, the client reaching it), it appends what it is sent for the partitions it still leads
  and sends LEADER acks, never ALL acks;
- **when the cut heals** it learns the metadata: a former leader cuts back the tail the new leader
  never had (every LEADER-acked record of the cut among it) and follows, and it rejoins the ISR
  once caught up.

That is the kind ``"cut"``: both ways. A cut has one of :data:`KINDS` (:class:`BrokerLink`), the
kinds of the client's link in the fault campaign:

- ``"cut-in"``: what the broker receives over NATS is lost, what it sends arrives. Its peers
  lose it as above (a follower's fetch requests reach its leader, which counts them, but the
  answers never come back); it learns nothing of the metadata; a publish it forwards for a
  partition another broker leads is taken there, and the ack never comes back to it;
- ``"cut-out"``: what it sends is lost, what it receives arrives. Its peers lose it as above, but
  it learns the metadata (the Raft log reaches it): after the election it names the new leader and
  refuses to serve as leader. As a leader until then it appends the NATS publishes it receives,
  never acks them, and commits them only if the cut heals before the majority elects another
  leader; a gRPC publish sent to it is lost on the way out;
- ``"slow"``: every NATS message of the broker waits :data:`SLOW_DELAY` seconds each way: its
  peers keep it, its replication rounds, the publishes it takes and the acks it sends come late;
- ``"lossy"``: a share of its NATS messages is lost each way (:data:`LOSSY_SHARE`), and of a
  burst past :data:`LOSSY_BURST` messages most is lost (:data:`LOSSY_RATE` messages a second go
  through): a lost replication round is fetched again, a lost publish or ack is the client's to
  notice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal, TypeVar

from airflow_provider_liftbridge._proto import api_pb2

from .faults import parked
from .model import BrokerLink, BrokerSlot, Direction
from .partition import Partition

T = TypeVar("T")


#: Where a publish received by a broker goes: appended, parked for a stalled leader, or lost.
Route = Literal["take", "park", "lost"]


def link_of(broker: BrokerSlot | None) -> BrokerLink | None:
    """``broker``'s cut link (``None``: not cut, or no broker)."""
    return None if broker is None else broker.link


def frozen(broker: BrokerSlot) -> bool:
    """Whether ``broker`` answers from what it knew when it was cut off (it learns nothing)."""
    return broker.link is not None and broker.link.frozen


def remember(broker: BrokerSlot, partitions: list[Partition]) -> None:
    """Note what ``broker`` knows of ``partitions`` as it is cut off (the view it answers from)."""
    broker.known = {(p.stream.name, p.id): (p.leader, list(p.isr)) for p in partitions}


def knows(broker: BrokerSlot, stream: str) -> bool:
    """Whether ``broker`` knows ``stream``: a frozen broker knows only the streams it knew."""
    return not frozen(broker) or any(name == stream for name, _ in broker.known)


def view_leader(part: Partition, broker: BrokerSlot) -> str:
    """The leader of ``part`` as ``broker`` sees it (a frozen broker: the one it last knew)."""
    if not frozen(broker):
        return part.leader
    return broker.known.get((part.stream.name, part.id), ("", []))[0]


def view_metadata(part: Partition, broker: BrokerSlot) -> api_pb2.PartitionMetadata:
    """``part``'s metadata as ``broker`` reports it: a frozen broker names the leader and the
    ISR it last knew, and as that leader its own high watermark and log end."""
    meta = part.metadata()
    if not frozen(broker):
        return meta
    leader, isr = broker.known.get((part.stream.name, part.id), ("", []))
    meta.leader = leader
    del meta.isr[:]
    meta.isr.extend(isr)
    repl = part.replication
    if repl is not None and leader == broker.id:
        own = repl.readable(broker.id)
        if own is not None:
            log_, hw = own
            meta.highWatermark, meta.newestOffset = hw, log_.newest_offset
    return meta


def _leader_slot(part: Partition) -> BrokerSlot | None:
    repl = part.replication
    return None if repl is None else repl.leader_broker


def _local(part: Partition, broker: BrokerSlot) -> bool:
    """Whether ``broker``'s NATS messages for ``part`` stay on its own NATS node: it leads ``part``
    and is cut off from its peers only (its node still loops them back to it)."""
    link = broker.link
    return link is not None and link.scope == "peers" and part.leader == broker.id


def publish_route(part: Partition, broker: BrokerSlot) -> tuple[Route, float]:
    """Where a publish to ``part`` that ``broker`` received goes, and after how many seconds (a
    slow link): it travels over ``broker``'s NATS link out and the leader's in (module docstring)."""
    repl = part.replication
    if _local(part, broker):
        return "take", 0.0  # cut from its peers only, it still takes what it leads
    delay = travel(((broker, "out"), (_leader_slot(part), "in")))
    if delay is None:
        return "lost", 0.0
    if repl is not None and not repl.leader_serving:
        if repl.leader_stalled:
            return "park", delay
        # Cut off with its receiving side open (cut-out), it still takes what reaches it.
        leader = _leader_slot(part)
        if leader is None or not leader.live or leader.link is None:
            return "lost", 0.0
    return "take", delay


def ack_route(part: Partition, broker: BrokerSlot | None) -> float | None:
    """After how many seconds an ack of ``part``'s leader, sent now, reaches ``broker`` (``None``:
    the client's NATS node), or ``None`` when it is lost on the leader's link out or the broker's in."""
    if broker is not None and _local(part, broker):
        return 0.0
    return travel(((_leader_slot(part), "out"), (broker, "in")))


def travel(legs: tuple[tuple[BrokerSlot | None, Direction], ...]) -> float | None:
    """How long a NATS message takes over ``legs`` (a broker's link and its direction), or ``None``
    when one of them loses it."""
    delay = 0.0
    for slot, direction in legs:
        link = link_of(slot)
        if link is not None:
            if not link.one(direction):
                return None
            delay += link.delay
    return delay


def arriving(delay: float, work: Callable[[], T]) -> asyncio.Future[T]:
    """``work`` run ``delay`` seconds from now (a message on a slow link), whether or not anyone
    still awaits the future that gets its result (see :func:`~.faults.parked`)."""
    queue: list[Callable[[], None]] = []
    future = parked(queue, work)
    asyncio.get_running_loop().call_later(delay, queue[0])
    return future
