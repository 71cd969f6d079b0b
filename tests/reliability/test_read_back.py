"""The campaign's read-back and a deposed leader (seed 59968 again, docs/reliability.md).

A broker that cannot reach the metadata log still names itself leader of what it led and serves
reads up to its own high watermark. On Liftbridge it went on doing so for 16 s after its link
healed, and the read-back, asking it first, took its shorter log for the stream. Here the dev
cluster's cut broker (devserver/isolation.py), still cut, stands in for it: the read-back must
not return while the brokers disagree on the leader, must read everything once they agree, and
must not read through a broker that did not answer its check (seed 59720).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, LiftbridgeError, Record
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServerProcess

from .campaign import Unsettled, leaders_disagree, read_back, replica_of
from .cut_leader import replicated_stream, three_brokers, wait_for_new_leader

pytestmark = [pytest.mark.timeout(300)]

TIMINGS = ClusterTimings.fast(
    replica_max_leader_timeout=3.0, replica_max_lag_time=3.0, replica_max_idle_wait=1.0, min_insync_replicas=2
)


#: The brokers' broker-list cache age (Liftbridge's ``metadata.cache.max.age``) in the test of
#: seed 59720, short enough to wait out.
SURVEY_CACHE = 6.0


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[DevServerProcess]:
    cache = getattr(request, "param", None)
    timings = TIMINGS if cache is None else replace(TIMINGS, metadata_cache_max_age=cache)
    with three_brokers("read-back-", timings) as server:
        yield server


def _deposed(cluster: DevServerProcess, stream: str, *, asked: bool = True) -> tuple[int, list[str]]:
    """Cut the leader of ``stream``'s partition 0 off from NATS until the majority has elected
    another and taken a record; return the cut broker's index and the addresses, the deposed
    leader (still naming itself) first, as b0 was in the campaign's address list. ``asked``: its
    first, slow FetchMetadata is behind it (else the read-back's is its first)."""
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
    if asked:
        _ask_metadata(addresses[leader], stream)
    return leader, [addresses[leader], *majority]


def _ask_metadata(address: str, stream: str) -> None:
    """One FetchMetadata on ``address``, 1 s at most: a broker that surveys its peers then has a
    fresh broker list, and answers the next at once."""
    with suppress(LiftbridgeError), LiftbridgeClient([address], timeout=1.0, max_retries=0) as one:
        one.fetch_metadata([stream])


def test_the_read_back_waits_while_a_deposed_leader_names_itself(cluster: DevServerProcess, stream_name: str) -> None:
    leader, seeds = _deposed(cluster, stream_name)
    assert leaders_disagree(seeds, stream_name, 1).startswith("partition 0: ")
    with pytest.raises(Unsettled, match="name"):
        read_back(seeds, stream_name, 1, within=2.0)
    cluster.heal_broker(leader)
    values = [m.value for m in read_back(seeds, stream_name, 1)]
    assert values == [b"before the cut", b"after the election"]


@pytest.mark.parametrize("cluster", [SURVEY_CACHE], indirect=True)
def test_the_read_back_reads_only_through_the_brokers_that_named_the_leader(
    cluster: DevServerProcess, stream_name: str
) -> None:
    # Seed 59720 (docs/reliability.md): the deposed leader's first FetchMetadata waited for its
    # peers past the leader check's 2 s, so the check left it out and found the others agreeing;
    # the reader then asked it first, got its next answer at once (naming itself) and read its
    # log, empty there, for the stream. Before the fix this read-back returned only the record
    # from before the cut. A broker's list of brokers is kept for metadata_cache_max_age
    # (SURVEY_CACHE here): once the deposed leader's, from before the cut, is that old, the
    # read-back's FetchMetadata is its first survey since; the majority's are made fresh.
    _, seeds = _deposed(cluster, stream_name, asked=False)
    time.sleep(SURVEY_CACHE + 0.5)  # a cache's age, not a race
    for address in seeds[1:]:
        _ask_metadata(address, stream_name)
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
