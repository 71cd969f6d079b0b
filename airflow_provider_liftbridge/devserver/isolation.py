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
"""

from __future__ import annotations

from typing import Literal

from airflow_provider_liftbridge._proto import api_pb2

from .model import BrokerSlot
from .partition import Partition

#: How a broker is cut off (:attr:`~.model.BrokerSlot.isolated`).
ISOLATIONS = ("nats", "peers")
#: Where a publish received by a broker goes: appended, parked for a stalled leader, or lost.
Route = Literal["take", "park", "lost"]


def remember(broker: BrokerSlot, partitions: list[Partition]) -> None:
    """Note what ``broker`` knows of ``partitions`` as it is cut off (the view it answers from)."""
    broker.known = {(p.stream.name, p.id): (p.leader, list(p.isr)) for p in partitions}


def knows(broker: BrokerSlot, stream: str) -> bool:
    """Whether ``broker`` knows ``stream``: an isolated broker knows only the streams it knew."""
    return not broker.isolated or any(name == stream for name, _ in broker.known)


def view_leader(part: Partition, broker: BrokerSlot) -> str:
    """The leader of ``part`` as ``broker`` sees it (an isolated broker: the one it last knew)."""
    if not broker.isolated:
        return part.leader
    return broker.known.get((part.stream.name, part.id), ("", []))[0]


def view_metadata(part: Partition, broker: BrokerSlot) -> api_pb2.PartitionMetadata:
    """``part``'s metadata as ``broker`` reports it: an isolated broker names the leader and the
    ISR it last knew, and as that leader its own high watermark and log end."""
    meta = part.metadata()
    if not broker.isolated:
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


def publish_route(part: Partition, broker: BrokerSlot) -> Route:
    """Where a publish to ``part`` that ``broker`` received goes (module docstring)."""
    repl = part.replication
    if broker.isolated:
        # Cut from its peers only, it still takes what it leads (and commits none of it).
        takes = broker.isolated == "peers" and part.leader == broker.id
        return "take" if takes else "lost"
    if repl is not None and not repl.leader_serving:
        return "park" if repl.leader_stalled else "lost"
    return "take"
