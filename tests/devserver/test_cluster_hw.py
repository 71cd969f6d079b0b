"""Per-replica high watermarks and Liftbridge's cursor cache, as measured on a real three-broker
Liftbridge v1.9 cluster (leader timeout 3 s, min ISR 2, one ``__cursors`` partition):

- a partition's leader SIGKILLed and back before the leader timeout reports, for a while, the
  high watermark it had checkpointed (255 with newest 2999 there), then its committed one once its
  followers fetch from it again;
- a cursor set just before the ``__cursors`` leader's kill reads -1 after its restart (the writes
  lie above its checkpointed high watermark), and keeps reading -1 after that settles: the miss
  was cached; a SetCursor heals it;
- a new leader starts from the high watermark it knew as a follower (one fetch behind).

Each runs a fresh 3-broker dev server over raw stubs. The windows that must be seen are held open
by long settings (no checkpoint in the test's time, followers re-fetching only seconds after a
restart, a minimum ISR the survivors cannot meet), and every wait polls for a state.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.devserver.cursors import (
    CACHE_SIZE,
    CursorCache,
    cursor_key,
    cursor_value,
    latest_cursor_offset,
)
from airflow_provider_liftbridge.devserver.log import PartitionLog
from airflow_provider_liftbridge.devserver.replication import HW_CHECKPOINT_FILE
from tests import margins

from .helpers import TIMEOUT, create, known_everywhere, partition_meta, publish, subscribe

Stub = api_pb2_grpc.APIStub

#: No checkpoint during a test (a killed broker comes back with -1, as Liftbridge without the file),
#: followers re-fetch from a restarted leader 5 s after it is back (the window the test looks in),
#: a leader stays one for 30 s, followers stay in the ISR meanwhile, and nothing commits below two
#: ISR members (as measured).
RESTART = ClusterTimings.fast(
    replica_max_leader_timeout=30.0,
    replica_max_lag_time=30.0,
    hw_checkpoint_interval=600.0,
    replica_max_idle_wait=5.0,
    min_insync_replicas=2,
)
#: How long a restarted leader's high watermark may take to settle under ``RESTART``: its followers
#: fetch again ``replica_max_idle_wait`` after it is back, and a caught-up follower checks in again
#: only a third of ``replica_max_lag_time`` later (10 s; it took 10.0 s on a quiet machine). The
#: waits for it get twice that.
SETTLE = RESTART.replica_max_idle_wait + RESTART.replica_max_lag_time / 3


def _stubs(server: DevServer) -> list[Stub]:
    return [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in server.addresses]


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    margins.wait_until(check, timeout, what, interval=0.02)


def _leader_id(stub: Stub, stream: str) -> str:
    """The partition's leader as FetchMetadata lists it ("" while none)."""
    resp = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=TIMEOUT)
    listed = resp.streamMetadata[0].partitions
    return listed[0].leader if 0 in listed else ""


def _leader(stub: Stub, stream: str) -> int:
    return int(_leader_id(stub, stream).rsplit("-", 1)[1])


def _hw_newest(stub: Stub, stream: str) -> tuple[int, int]:
    meta = partition_meta(stub, stream)
    return meta.highWatermark, meta.newestOffset


def test_a_leader_back_within_the_leader_timeout_reports_its_checkpointed_hw_until_followers_fetch(
    stream_name: str,
) -> None:
    with DevServer(brokers=3, timings=RESTART) as server:
        stubs = _stubs(server)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        leader = _leader(stubs[0], stream_name)
        lead = stubs[leader]
        for i in range(100):
            assert publish(lead, stream_name, b"m%d" % i, ackPolicy=pb.ALL).ack.offset == i
        assert _hw_newest(lead, stream_name) == (99, 99)
        server.kill_broker(leader)
        server.start_broker(leader)
        # Still the leader, from its checkpoint (none yet: -1), with everything in its log.
        meta = partition_meta(lead, stream_name)
        assert meta.leader == f"broker-{leader}"
        assert (meta.highWatermark, meta.newestOffset) == (-1, 99)
        # Its subscribers see only up to that high watermark meanwhile.
        req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
        early = subscribe(lead, req)
        assert (early.offsets, early.details) == ([], "Stream is empty")
        # Its followers fetch again (replica_max_idle_wait later) and it commits what they have.
        _wait_for("the high watermark to settle", lambda: _hw_newest(lead, stream_name) == (99, 99), timeout=2 * SETTLE)
        assert subscribe(lead, req).offsets == list(range(100))


def test_fetch_cursor_after_the_cursors_leader_restart_caches_a_stale_miss_until_set(stream_name: str) -> None:
    with DevServer(brokers=3, timings=RESTART) as server:
        stubs = _stubs(server)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        known_everywhere(stubs, "__cursors")
        owner = _leader(stubs[0], "__cursors")
        lead = stubs[owner]
        for value in range(0, 3000, 100):  # 30 writes, 0..2900
            lead.SetCursor(pb.SetCursorRequest(stream=stream_name, cursorId="c", offset=value), timeout=TIMEOUT)
        fetch = pb.FetchCursorRequest(stream=stream_name, cursorId="c")
        assert lead.FetchCursor(fetch, timeout=TIMEOUT).offset == 2900
        assert _hw_newest(lead, "__cursors") == (29, 29)
        server.kill_broker(owner)
        server.start_broker(owner)
        assert partition_meta(lead, "__cursors").leader == f"broker-{owner}"
        # Its replica's high watermark is its checkpoint (-1: none): the miss reads nothing.
        assert _hw_newest(lead, "__cursors") == (-1, 29)
        assert lead.FetchCursor(fetch, timeout=TIMEOUT).offset == -1
        # The high watermark settles; the cached miss stays.
        _wait_for(
            "the __cursors high watermark to settle",
            lambda: _hw_newest(lead, "__cursors") == (29, 29),
            timeout=2 * SETTLE,
        )
        assert lead.FetchCursor(fetch, timeout=TIMEOUT).offset == -1
        # A SetCursor replaces the cached value.
        lead.SetCursor(pb.SetCursorRequest(stream=stream_name, cursorId="c", offset=3000), timeout=TIMEOUT)
        assert lead.FetchCursor(fetch, timeout=TIMEOUT).offset == 3000


def test_a_cursor_read_from_the_log_once_the_restarted_leader_settled(stream_name: str) -> None:
    """A cursor first fetched after the restarted ``__cursors`` leader's high watermark settled is
    found in its log (the cache was purged by the restart, the miss reads up to the new HW)."""
    with DevServer(brokers=3, timings=RESTART) as server:
        stubs = _stubs(server)
        known_everywhere(stubs, "__cursors")
        owner = _leader(stubs[0], "__cursors")
        lead = stubs[owner]
        lead.SetCursor(pb.SetCursorRequest(stream=stream_name, cursorId="d", offset=7), timeout=TIMEOUT)
        server.kill_broker(owner)
        server.start_broker(owner)
        _wait_for(
            "the __cursors high watermark to settle",
            lambda: _hw_newest(lead, "__cursors") == (0, 0),
            timeout=2 * SETTLE,
        )
        assert lead.FetchCursor(pb.FetchCursorRequest(stream=stream_name, cursorId="d"), timeout=TIMEOUT).offset == 7


def test_a_new_leader_starts_from_the_high_watermark_it_knew_as_a_follower(stream_name: str) -> None:
    # Followers check in only every 20 s (lag time 60 s), so after the last ALL ack they still hold
    # the high watermark of the fetch before; with minIsr 3 the two survivors cannot commit more.
    timings = ClusterTimings.fast(replica_max_lag_time=60.0)
    with DevServer(brokers=3, timings=timings) as server:
        stubs = _stubs(server)
        create(stubs[0], stream_name, replicationFactor=3, minIsr=pb.NullableInt32(value=3))
        known_everywhere(stubs, stream_name)
        leader = _leader(stubs[0], stream_name)
        for i in range(10):
            assert publish(stubs[leader], stream_name, b"m%d" % i, ackPolicy=pb.ALL).ack.offset == i
        assert _hw_newest(stubs[leader], stream_name) == (9, 9)
        server.kill_broker(leader)
        other = stubs[(leader + 1) % 3]
        _wait_for("a new leader", lambda: _leader_id(other, stream_name) not in ("", f"broker-{leader}"))
        new = _leader(other, stream_name)
        hw, newest = _hw_newest(stubs[new], stream_name)
        # One fetch behind: the answer to its last fetch carried the high watermark before it.
        assert (hw, newest) == (8, 9)
        # The old leader rejoins: three ISR members again, and the new leader commits the rest.
        server.start_broker(leader)
        _wait_for("the high watermark to settle", lambda: _hw_newest(stubs[new], stream_name) == (9, 9))


def test_a_killed_leader_comes_back_with_its_last_checkpoint(stream_name: str, tmp_path: Path) -> None:
    timings = ClusterTimings.fast(
        replica_max_leader_timeout=30.0,
        replica_max_lag_time=30.0,
        hw_checkpoint_interval=0.05,
        replica_max_idle_wait=3.0,
    )
    with DevServer(brokers=3, timings=timings, data_dir=tmp_path) as server:
        stubs = _stubs(server)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        leader = _leader(stubs[0], stream_name)
        for i in range(10):
            publish(stubs[leader], stream_name, b"m%d" % i, ackPolicy=pb.ALL)
        (replica_dir,) = tmp_path.glob(f"streams/{stream_name}-*/{'0' if leader == 0 else f'0.broker-{leader}'}")
        checkpoint = replica_dir / HW_CHECKPOINT_FILE
        _wait_for("the leader's checkpoint", lambda: checkpoint.exists() and checkpoint.read_text() == "9")
        server.kill_broker(leader)
        server.start_broker(leader)
        assert _hw_newest(stubs[leader], stream_name) == (9, 9)


def test_the_cursor_cache_keeps_the_512_most_recently_used() -> None:
    cache = CursorCache()
    for i in range(CACHE_SIZE):
        cache.add(b"k%d" % i, i)
    assert cache.get(b"k0") == 0  # now the most recently used
    cache.add(b"new", 1)
    assert len(cache) == CACHE_SIZE
    assert (cache.get(b"k0"), cache.get(b"k1"), cache.get(b"new")) == (0, None, 1)


def test_a_cache_miss_takes_the_newest_message_of_the_key_at_or_below_the_hw(tmp_path: Path) -> None:
    log_ = PartitionLog(tmp_path / "c")
    try:
        key = cursor_key("c", "s", 0)
        for offset, (k, value) in enumerate([(key, 50), (b"other", 99), (key, 20), (key, 70)]):
            body = pb.Message(offset=offset, key=k, value=cursor_value("c", "s", 0, value)).SerializeToString()
            log_.append(body, 0)
        log_.flush()
        assert latest_cursor_offset(log_, key, -1) == -1
        assert latest_cursor_offset(log_, key, 0) == 50
        assert latest_cursor_offset(log_, key, 2) == 20  # the newest, read backwards (not the largest, 50)
        assert latest_cursor_offset(log_, key, 3) == 70
        assert latest_cursor_offset(log_, b"missing", 3) == -1
    finally:
        log_.close()
