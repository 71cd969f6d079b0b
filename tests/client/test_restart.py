"""A subscription survives its (only) broker being killed and restarted: it resubscribes from
the last delivered offset + 1 within ``resubscribe_wait``, with no gap and no duplicate. Publishing
over NATS right after a full-cluster restart stores every record once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    NO_RESEND,
    AckPolicy,
    LiftbridgeClient,
    PublishError,
    StartPosition,
    StopPosition,
    UnavailableError,
)
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer, DevServerProcess
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from tests import margins
from tests.margins import bounded
from tests.processes import restart_nats


def test_resubscribe_across_a_broker_kill_and_restart(make_client: Any, tmp_path: Path) -> None:
    with DevServerProcess(data_dir=tmp_path, brokers=1) as srv:
        c = make_client(srv.address, timeout=5.0, max_retries=8, backoff_base=0.05, resubscribe_wait=20.0)
        c.create_stream("restart", "restart")
        c.publish_many("restart", [b"a%d" % i for i in range(10)])
        got: list[Any] = []
        done = threading.Event()

        def consume() -> None:
            for m in c.subscribe("restart"):
                got.append(m)
                if len(got) == 20:
                    break
            done.set()

        threading.Thread(target=consume, daemon=True).start()
        margins.wait_until(lambda: len(got) >= 10, 10, "10 messages read", interval=0.02)
        assert len(got) == 10
        srv.kill()
        time.sleep(0.5)  # the subscription sees the failure and starts resubscribing
        srv.start()
        c.publish_many("restart", [b"b%d" % i for i in range(10)])
        assert done.wait(20), f"subscription stalled after {len(got)} messages"
        assert [m.offset for m in got] == list(range(20))
        assert [m.value for m in got[9:11]] == [b"a9", b"b0"]


def test_subscription_gives_up_after_resubscribe_wait(make_client: Any, tmp_path: Path) -> None:
    with DevServerProcess(data_dir=tmp_path, brokers=1) as srv:
        c = make_client(srv.address, timeout=2.0, max_retries=2, backoff_base=0.05, resubscribe_wait=1.5)
        c.create_stream("gone", "gone")
        c.publish("gone", b"x")
        it = c.subscribe("gone")
        assert next(it).value == b"x"
        srv.kill()
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="last offset delivered: 0"):
            next(it)
        assert 1.0 < time.monotonic() - started < 10


def create_stream(cluster: DevServer, name: str) -> None:
    """Create ``name`` on all three brokers with the client's default time-out: the tests' clients
    have short ones for what they test, not for setting up (a 0.2 s creation failed a busy run)."""
    with LiftbridgeClient(cluster.address) as admin:
        admin.create_stream(name, name, replication_factor=3)


@pytest.mark.parametrize("down", [0.0, 0.3])
def test_publish_many_over_nats_right_after_a_full_restart_sends_again_only_what_was_not_stored(
    fast_cluster: DevServer, down: float
) -> None:
    """Published while the cluster restarts (brokers down, then partitions without a leader), the
    records are dropped and their acks time out. The call checks that nothing was stored (the
    leader's newest offset) and sends them again within its retry budget, never blindly (the
    default ``resend=None``), so each is stored once."""
    with LiftbridgeClient(
        fast_cluster.address, nats_servers=[fast_cluster.nats_url], timeout=0.5, max_retries=8, backoff_base=0.05
    ) as c:
        create_stream(fast_cluster, "restarting")
        c.publish_many("restarting", [b"before"], path="nats")  # the client has seen the stream
        restart = threading.Thread(target=fast_cluster.restart_cluster, kwargs={"down": down})
        restart.start()
        time.sleep(0.05 + down / 2)  # inside the window: brokers down, or partitions without a leader
        records = [b"r%d" % i for i in range(20)]
        acks = c.publish_many("restarting", records, path="nats", ack_policy=AckPolicy.LEADER)
        restart.join()
        assert [a.offset for a in acks] == list(range(1, 21))
        stored = c.subscribe("restarting", start_at=StartPosition.EARLIEST, stop_at=20)  # once committed
        assert [m.value for m in stored] == [b"before", *records]


def test_with_no_resend_a_restart_fails_the_call_naming_every_record_and_sends_nothing_again(
    fast_cluster: DevServer,
) -> None:
    """``resend=NO_RESEND`` (what exactly-once publishing passes) means the call never sends a
    record again on its own, not even one it could prove unstored: the caller decides after
    reading (issue 36: exactly-once logged "re-sending ..." although it had asked for none). The
    call fails, every record named: timed out (may or may not be stored) or never sent."""
    with LiftbridgeClient(
        fast_cluster.address, nats_servers=[fast_cluster.nats_url], timeout=0.5, max_retries=8, backoff_base=0.05
    ) as c:
        create_stream(fast_cluster, "restarting")
        c.publish_many("restarting", [b"before"], path="nats")
        # Held in the window, however slowly this runs: partitions without a leader drop what they are sent.
        fast_cluster.restart_cluster(hold="no-leaders")
        records = [b"r%d" % i for i in range(20)]
        try:
            with pytest.raises(PublishError) as caught:
                c.publish_many("restarting", records, path="nats", ack_policy=AckPolicy.LEADER, resend=NO_RESEND)
        finally:
            fast_cluster.release_restart_window()
        err = caught.value
        assert all(err.acks[i] is not None or i in err.errors for i in range(20)), err.errors
        c.publish_many("restarting", [b"after"], path="nats", ack_policy=AckPolicy.ALL)  # back, and committed
        whole = c.subscribe("restarting", start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
        stored = [m.value for m in whole]
    assert stored[0] == b"before" and stored[-1] == b"after"
    assert len(set(stored)) == len(stored)  # nothing stored twice


def test_publish_many_over_nats_does_not_send_again_what_a_restarted_cluster_stored_without_acking() -> None:
    """Right after a restart the leaders store records but commit nothing for a while, so ALL acks
    come late. Their time-outs are not a reason to send again: the partition has moved, the
    records may be stored (they are), and the call reports them as such, with no second copy."""
    with (
        DevServer(brokers=3, timings=ClusterTimings.fast()) as cluster,
        LiftbridgeClient(cluster.address, nats_servers=[cluster.nats_url], max_retries=3, backoff_base=0.05) as c,
    ):
        create_stream(cluster, "late-acks")
        c.publish_many("late-acks", [b"before"], path="nats")
        # Held where leaders store and nothing commits, however slowly this runs (a busy run found
        # the 0.2 s calls of a timed version late, and a publish a stall had pushed past the window).
        cluster.restart_cluster(hold="no-commits")
        records = [b"r%d" % i for i in range(5)]
        try:
            with pytest.raises(PublishError, match="may or may not be stored"):
                # A short ack wait: no ack can come while the window is held.
                c.publish_many(
                    "late-acks", records, path="nats", ack_policy=AckPolicy.ALL, resend=NO_RESEND, timeout=0.2
                )
        finally:
            cluster.release_restart_window()
        stored = c.subscribe("late-acks", start_at=StartPosition.EARLIEST, stop_at=5)  # once committed
        assert [m.value for m in stored] == [b"before", *records]


def test_publish_over_nats_uses_a_nats_server_back_after_a_restart_at_once() -> None:
    # Seed 6029 of the fault campaign: the client's NATS node was down for 2.8 s before an
    # exactly-once publish over NATS. The client remembered the failed connect for 30 s (so that
    # path="auto" falls back to gRPC without waiting for NATS every time) and failed every send
    # at once meanwhile, although NATS was back: the try used up its 8 resumes (22 s) and failed.
    # A caller that asked for NATS has no other path: it connects again on every send.
    nats = NatsServerProcess()
    url = nats.start()
    try:
        with DevServer(nats_url=url) as srv:
            with LiftbridgeClient(srv.address, timeout=5.0) as admin:
                admin.create_stream("nats-back", "nats-back")
            with LiftbridgeClient(srv.address, nats_servers=[url], timeout=5.0) as c:
                nats.kill()
                with pytest.raises(PublishError) as raised:
                    c.publish_many("nats-back", [b"while down"], path="nats")
                assert isinstance(raised.value.__cause__, UnavailableError), repr(raised.value.__cause__)
                restart_nats(nats)
                # Another client shows when the server takes NATS publishes again.
                with LiftbridgeClient(srv.address, nats_servers=[url], timeout=5.0) as probe:
                    with bounded("the server took NATS publishes again", 20):
                        deadline = time.monotonic() + 20
                        while True:
                            try:
                                probe.publish_many("nats-back", [b"probe"], path="nats")
                                break
                            except PublishError:
                                assert time.monotonic() < deadline, "the dev server did not take NATS publishes again"
                                time.sleep(0.2)
                acks = c.publish_many("nats-back", [b"after"], path="nats")
                assert len(acks) == 1
    finally:
        nats.stop()
