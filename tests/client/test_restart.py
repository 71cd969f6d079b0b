"""A subscription survives its (only) broker being killed and restarted: it resubscribes from
the last delivered offset + 1 within ``resubscribe_wait``, with no gap and no duplicate."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import UnavailableError
from airflow_provider_liftbridge.devserver import DevServerProcess


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
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
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
