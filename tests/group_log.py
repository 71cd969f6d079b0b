"""What consumer-group members said they read: the client's log line of each adopted assignment
(``client/consumer.py``, "now reads"). Tests wait for a split of the partitions with it, instead
of sleeping until the members have probably joined."""

from __future__ import annotations

import asyncio
import logging

import pytest

#: The logger of the client's member operations.
CONSUMER_LOG = "airflow_provider_liftbridge.client.consumer"


def listen(caplog: pytest.LogCaptureFixture) -> None:
    """Capture the members' log lines (call before the members start)."""
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)


def reads(caplog: pytest.LogCaptureFixture, group: str) -> dict[str, str]:
    """What each member of ``group`` last said it reads: consumer id -> its assignments (as logged)."""
    said: dict[str, str] = {}
    for record in caplog.records:
        if record.name == CONSUMER_LOG and " now reads " in str(record.msg):
            member, of_group, _, assignments = record.args[:4]  # type: ignore[index,misc]
            if of_group == group:
                said[str(member)] = str(assignments)
    return said


async def until_split(caplog: pytest.LogCaptureFixture, group: str, split: dict[str, dict[str, list[int]]]) -> None:
    """Return once each member of ``split`` has said it reads exactly its partitions there. A split
    lasts while the members stay in the group (their keepers heartbeat)."""
    wanted = {member: str(assignments) for member, assignments in split.items()}
    while reads(caplog, group) != wanted:
        await asyncio.sleep(0.05)
