"""The group roster (client/group_roster.py): members record their epoch and assignments, and
FetchMetadata's group answer, against the dev server's real groups (short timeouts)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient
from airflow_provider_liftbridge.client.group_roster import ROSTER_STREAM, MemberRecord
from airflow_provider_liftbridge.client.reading.roster import read_roster
from airflow_provider_liftbridge.devserver import DevServer
from tests import margins


@pytest.fixture
def client(groups_server: DevServer) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(groups_server.address, timeout=5.0) as c:
        yield c


def _of(client: LiftbridgeClient, group: str) -> dict[str, MemberRecord]:
    return {r.consumer_id: r for r in read_roster(client) if r.group_id == group}


def test_members_record_their_epoch_and_assignments_and_leaving(client: LiftbridgeClient, stream_name: str) -> None:
    """Two members of a group over a 2-partition stream: each records the group's current epoch
    and its one partition; the metadata names the coordinator and that epoch; the member that
    leaves records it, the other then holds both partitions at a newer epoch; with none left
    the cluster no longer knows the group."""
    client.create_stream(stream_name, stream_name, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert client.fetch_group_metadata([group]) == {group: None}
    with client.group_consumer(group, stream_name, consumer_id="a") as a:
        with client.group_consumer(group, stream_name, consumer_id="b") as b:

            def both_current() -> bool:
                a.check_assignments()
                b.check_assignments()
                info = client.fetch_group_metadata([group])[group]
                seen = _of(client, group)
                return (
                    info is not None
                    and set(seen) == {"a", "b"}
                    and all(r.epoch == info.epoch and not r.left for r in seen.values())
                    and sorted(p for r in seen.values() for p in r.assignments.get(stream_name, [])) == [0, 1]
                )

            margins.wait_until(both_current, 20.0, "both members recorded at the group's epoch", interval=0.1)
            info = client.fetch_group_metadata([group])[group]
            assert info is not None and info.coordinator
            seen = _of(client, group)
            assert seen["a"].coordinator == info.coordinator and seen["a"].streams == [stream_name]
            assert {len(r.assignments[stream_name]) for r in seen.values()} == {1}
            left_at = info.epoch
        assert _of(client, group)["b"].left

        def a_holds_both() -> bool:
            a.check_assignments()
            record = _of(client, group)["a"]
            return record.epoch > left_at and record.assignments.get(stream_name) == [0, 1]

        margins.wait_until(a_holds_both, 20.0, "the remaining member recorded both partitions", interval=0.1)
    assert _of(client, group)["a"].left
    assert client.fetch_group_metadata([group]) == {group: None}
    assert ROSTER_STREAM in client.fetch_metadata([ROSTER_STREAM]).streams


def test_an_asyncio_member_records_itself_and_its_group_is_described(
    groups_server: DevServer, client: LiftbridgeClient, stream_name: str
) -> None:
    """The asyncio client shares the operations: its member records itself, and its
    ``fetch_group_metadata`` answers as the blocking client's."""
    client.create_stream(stream_name, stream_name)
    group = f"g-{uuid.uuid4().hex[:8]}"

    async def run() -> tuple[Any, Any]:
        async with AsyncLiftbridgeClient(groups_server.address, timeout=5.0) as aclient:
            async with aclient.group_consumer(group, stream_name, consumer_id="solo") as consumer:
                await consumer.check_assignments()
                return (await aclient.fetch_group_metadata([group]))[group], _of(client, group).get("solo")

    info, record = asyncio.run(run())
    assert info is not None and record is not None
    assert (record.epoch, record.coordinator, record.assignments) == (info.epoch, info.coordinator, {stream_name: [0]})
    assert _of(client, group)["solo"].left
