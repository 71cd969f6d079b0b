"""A SetCursor whose commit never comes ends within the call's timeout (seed 5006 of the fault
campaign), on a real three-broker dev cluster over gRPC, with a real nats-server child.

A cursor is a message of the ``__cursors`` stream written with ack policy ALL (Liftbridge's
``cursors.go``): with both followers of its partition stopped (SIGSTOP, kept in the ISR), the
leader never commits it and answers INTERNAL "context deadline exceeded" when its wait ends, after
5 s (Liftbridge's ``defaultCursorTimeout``; the client's timeout here is longer, so that answer
comes first). Each attempt then takes 5 s; before the fix the client made ``max_retries + 1`` of
them, 45 s for a 6 s timeout. The blocking client only: the retry rule is the shared operations'
(``client/routing.py:retry_wait``), which ``tests/client/test_ops_scripted.py`` drives for both.
"""

from __future__ import annotations

import time
import zlib

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError, RequestTimeoutError
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer

#: Followers stay in the ISR and leaders keep leading while the test looks.
STILL = ClusterTimings.fast(replica_max_lag_time=60.0, replica_max_leader_timeout=60.0, metadata_election_timeout=60.0)
#: Above the server's own 5 s wait for the commit (see the module docstring).
TIMEOUT = 6.0
RETRIES = 8


def test_a_set_cursor_whose_commit_never_comes_ends_within_its_timeout() -> None:
    with (
        DevServer(brokers=3, timings=STILL) as srv,
        LiftbridgeClient(srv.addresses, timeout=TIMEOUT, max_retries=RETRIES) as c,
    ):
        c.set_cursor("reader", "s", 0, 1)  # routes and metadata learned while every broker runs
        parts = c.fetch_metadata(["__cursors"]).streams["__cursors"].partitions
        owner = parts[zlib.crc32(b"reader,s,0") % len(parts)].leader
        followers = [i for i, b in enumerate(srv.broker_ids) if b != owner]
        for i in followers:
            srv.stall_broker(i)
        try:
            started = time.monotonic()
            with pytest.raises(LiftbridgeError) as raised:
                c.set_cursor("reader", "s", 0, 2)
            elapsed = time.monotonic() - started
        finally:
            for i in followers:
                srv.resume_broker(i)
        assert isinstance(raised.value, RequestTimeoutError), raised.value
        # Bound: the timeout, then one more attempt begun before it ran out (5 s) after a backoff
        # (at most 2 s); the rest is slack for a loaded machine. Before the fix: 9 attempts of 5 s.
        assert elapsed < 2 * TIMEOUT + 6.0, f"set_cursor took {elapsed:.1f} s with a {TIMEOUT:g} s timeout"
        c.set_cursor("reader", "s", 0, 3)  # the cluster runs again: the cursor is written
        assert c.fetch_cursor("reader", "s", 0) == 3
