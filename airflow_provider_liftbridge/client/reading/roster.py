"""Reading the group roster that consumer-group members record (:mod:`..group_roster`).

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

from ..group_roster import ROSTER_STREAM, MemberRecord
from ..sync_client import LiftbridgeClient
from .registry import tail_entries

__all__ = ["read_roster"]


def read_roster(client: LiftbridgeClient, *, limit: int = 2_000, stream: str = ROSTER_STREAM) -> list[MemberRecord]:
    """The newest record of each member among the roster's newest ``limit`` messages, by group
    and member (``[]`` while no member recorded itself). Messages that are not records are skipped.

    :raises LiftbridgeError: the roster could not be read.
    """
    newest: dict[bytes, MemberRecord] = {}
    for record in tail_entries(client, stream, limit, MemberRecord.from_json):
        if record.key not in newest or record.recorded_at >= newest[record.key].recorded_at:
            newest[record.key] = record
    return sorted(newest.values(), key=lambda r: (r.group_id, r.consumer_id))
