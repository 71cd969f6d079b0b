"""The campaign's read-back and a deposed leader (seed 59968 again, docs/reliability.md).

A broker that cannot reach the metadata log still names itself leader of what it led and serves
reads up to its own high watermark. On Liftbridge it went on doing so for 16 s after its link
healed, and the read-back, asking it first, took its shorter log for the stream. Here the dev
cluster's cut broker (devserver/isolation.py), still cut, stands in for it: the read-back must
not return while the brokers disagree on the leader, and must read everything once they agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, LiftbridgeError, Record
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServerProcess

from .campaign import Unsettled, leaders_disagree, read_back, replica_of
from .cut_leader import replicated_stream, three_brokers, wait_for_new_leader

pytestmark = [pytest.mark.timeout(300)]

TIMINGS = ClusterTimings.fast(
    replica_max_leader_timeout=3.0, replica_max_lag_time=3.0, replica_max_idle_wait=1.0, min_insync_replicas=2
)


@pytest.fixture
def cluster() -> Iterator[DevServerProcess]:
    with three_brokers("read-back-", TIMINGS) as server:
        yield server


def _deposed(cluster: DevServerProcess, stream: str) -> tuple[int, list[str]]:
    """Cut the leader of ``stream``'s partition 0 off from NATS until the majority has elected
    another and taken a record; return the cut broker's index and the addresses, the deposed
    leader (still naming itself) first, as b0 was in the campaign's address list."""
    addresses = cluster.addresses
    leader, majority = replicated_stream(cluster, stream)
    with LiftbridgeClient(addresses, timeout=5.0, max_retries=8) as admin:
        admin.publish_many(stream, [Record(b"before the cut")], ack_policy=AckPolicy.ALL)
    cluster.cut_broker_from_nats(leader, "cut")
    wait_for_new_leader(cluster, majority, stream, leader)
    with LiftbridgeClient(majority, timeout=5.0, max_retries=8) as client:
        client.publish_many(stream, [Record(b"after the election")], ack_policy=AckPolicy.ALL)
    # Its first FetchMetadata waits for its peers' answers until the caller's deadline (the
    # broker survey, devserver/faults.py); what it gathered is kept, so the next ones answer at
    # once, from the metadata it last knew: as b0 answered right after its link healed.
    with suppress(LiftbridgeError), LiftbridgeClient([addresses[leader]], timeout=1.0, max_retries=0) as cut:
        cut.fetch_metadata([stream])
    return leader, [addresses[leader], *majority]


def test_the_read_back_waits_while_a_deposed_leader_names_itself(cluster: DevServerProcess, stream_name: str) -> None:
    leader, seeds = _deposed(cluster, stream_name)
    assert leaders_disagree(seeds, stream_name, 1).startswith("partition 0: ")
    with pytest.raises(Unsettled, match="name"):
        read_back(seeds, stream_name, 1, within=2.0)
    cluster.heal_broker(leader)
    values = [m.value for m in read_back(seeds, stream_name, 1)]
    assert values == [b"before the cut", b"after the election"]


def test_a_strike_is_not_aimed_at_a_deposed_leader_that_names_itself(
    cluster: DevServerProcess, stream_name: str
) -> None:
    # The campaign's "recovery" strike aims at the partition leader again: asking the deposed
    # leader first, it cut b0 a second time and never touched the leader of the time (seed 59968).
    leader, seeds = _deposed(cluster, stream_name)
    with pytest.raises(Unsettled, match=r"the leader of .* was not found in 2 s"):
        replica_of(seeds, stream_name, 0, "leader", within=2.0)  # before the fix: the deposed leader
    cluster.heal_broker(leader)
    new_leader = replica_of(seeds, stream_name, 0, "leader")
    assert new_leader != cluster.broker_ids[leader]
    assert replica_of(seeds[1:], stream_name, 0, "leader") == new_leader
