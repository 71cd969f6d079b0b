"""The group roster: what each consumer-group member last knew of itself, recorded by the member.

Liftbridge has no call that lists a group's members or their assignments: FetchMetadata names a
group's coordinator and epoch, and FetchConsumerGroupAssignments answers only a member about
itself (and is its heartbeat, so nobody else may call it). So a member of this client records,
whenever its epoch or its assignments change and when it leaves, one small JSON message in the
roster stream :data:`ROSTER_STREAM` (one partition, compacted, keyed by group and member; created
with a retention limit by the first member): the group, the member, its streams, the epoch and
coordinator it knows, its assignments, the time, and whether it left. The Airflow UI view reads
it (``client/reading/roster.py``, ``ui/groups.py``). Recording is best effort: a failure is
logged and the member goes on.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

from airflow_provider_liftbridge._proto import api_pb2

from . import operations
from .effects import Op
from .errors import InvalidArgumentError, LiftbridgeError, StreamExistsError
from .publishing import single
from .routing import ClientCore
from .stream_options import BOOKKEEPING_SEGMENT_BYTES, StreamOptions
from .types import AckPolicy

__all__ = [
    "ROSTER_MAX_AGE",
    "ROSTER_MAX_MESSAGES",
    "ROSTER_STREAM",
    "GroupInfo",
    "MemberRecord",
    "fetch_group_metadata",
    "record_member",
]

log = logging.getLogger(__name__)

#: The roster stream (and its subject).
ROSTER_STREAM = "airflow-liftbridge-group-members"
#: Its retention: at most this many records, none older than :data:`ROSTER_MAX_AGE` (compaction
#: keeps the newest per member before that).
ROSTER_MAX_MESSAGES = 10_000
ROSTER_MAX_AGE = timedelta(days=7)
#: Seconds a record's publish waits for its ack at most: it runs in the member's heartbeat path.
RECORD_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as the cluster's metadata describes it: its coordinator (a broker id) and
    its epoch (the generation, which moves on with every join, leave and coordinator change)."""

    group_id: str
    coordinator: str
    epoch: int


def fetch_group_metadata(core: ClientCore, group_ids: Sequence[str]) -> Op[dict[str, GroupInfo | None]]:
    """The operation of ``LiftbridgeClient.fetch_group_metadata``: each group's coordinator and
    epoch from FetchMetadata, ``None`` for a group the cluster does not know (it has no members:
    the last one left or timed out, or it never existed).

    :raises UnavailableError: no broker answered.
    """
    if not group_ids:
        return {}
    # Streams: only the cursors stream, so the answer does not list every stream of the cluster.
    request = api_pb2.FetchMetadataRequest(streams=["__cursors"], groups=list(group_ids))
    response = cast(api_pb2.FetchMetadataResponse, (yield from operations.unary(core, "FetchMetadata", request)))
    found: dict[str, GroupInfo | None] = dict.fromkeys(group_ids)
    for group in response.groupMetadata:
        if group.groupId in found and group.error == api_pb2.ConsumerGroupMetadata.OK:
            found[group.groupId] = GroupInfo(group.groupId, group.coordinator, int(group.epoch))
    return found


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member as it last recorded itself.

    :param group_id: / :param consumer_id: the group and the member.
    :param streams: the streams it joined for.
    :param epoch: / :param coordinator: the group's epoch and coordinator as the member knew them.
    :param assignments: its partitions per stream.
    :param left: it left the group (its last record).
    :param recorded_at: milliseconds since the epoch.
    """

    group_id: str
    consumer_id: str
    streams: Sequence[str]
    epoch: int
    coordinator: str
    assignments: Mapping[str, Sequence[int]]
    left: bool = False
    recorded_at: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def key(self) -> bytes:
        return f"{self.group_id}\x1f{self.consumer_id}".encode()

    def to_json(self) -> bytes:
        """The roster message's value."""
        return json.dumps(
            {
                "group_id": self.group_id,
                "consumer_id": self.consumer_id,
                "streams": list(self.streams),
                "epoch": self.epoch,
                "coordinator": self.coordinator,
                "assignments": {s: list(p) for s, p in sorted(self.assignments.items())},
                "left": self.left,
                "recorded_at": self.recorded_at,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, value: bytes) -> MemberRecord:
        """A record from a roster message's value.

        :raises InvalidArgumentError: not a record.
        """
        try:
            data: dict[str, Any] = json.loads(value)
            return cls(
                group_id=str(data["group_id"]),
                consumer_id=str(data["consumer_id"]),
                streams=[str(s) for s in data["streams"]],
                epoch=int(data["epoch"]),
                coordinator=str(data["coordinator"]),
                assignments={str(s): [int(p) for p in parts] for s, parts in data["assignments"].items()},
                left=bool(data.get("left", False)),
                recorded_at=int(data["recorded_at"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"not a group roster record ({type(exc).__name__}: {exc})") from None


def record_member(core: ClientCore, record: MemberRecord, *, stream: str = ROSTER_STREAM) -> Op[bool]:
    """Append ``record`` to the roster (creating the stream if missing); ``False`` when that
    failed (logged as a warning: the roster is for people looking, a member never depends on it)."""
    try:
        metadata = yield from operations.fetch_metadata(core, [stream])
        if stream not in metadata.streams:
            options = StreamOptions(
                compact_enabled=True,
                retention_max_messages=ROSTER_MAX_MESSAGES,
                retention_max_age=ROSTER_MAX_AGE,
                segment_max_bytes=BOOKKEEPING_SEGMENT_BYTES,
            )
            try:
                yield from operations.create_stream(core, stream, stream, options)
            except StreamExistsError:
                pass  # another member created it meanwhile
        yield from single.publish(
            core, stream, record.to_json(), key=record.key, ack_policy=AckPolicy.LEADER, timeout=RECORD_TIMEOUT
        )
    except LiftbridgeError as exc:
        log.warning(
            "consumer %s of group %s: could not record itself in %s (%s); it goes on",
            record.consumer_id,
            record.group_id,
            stream,
            exc,
        )
        return False
    return True
