"""A subscription stopped early leaves no connection behind once its client is closed.

A blocking Subscribe is read on the caller's thread from a completion queue of its own; cancelled
with its status still due, gRPC kept the call, and its TCP connection, for the life of the process,
closed channel or not (``end_call`` in ``client/transport/channels.py``). The consume-operator
tests left one connection per task try that failed or stopped reading early (two descriptors each,
the dev server's end being in the same process); a long-lived process using the client, one
socket per subscription it stopped early."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from functools import partial

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, StopPosition
from airflow_provider_liftbridge.client.transport import aio as async_transport
from tests import margins

#: Subscriptions each test stops early; the connections they leaked would be this many.
ROUNDS = 12
#: Sockets to the broker the process may hold after the clients are gone without counting as a
#: leak: another test's channel still winding down.
SLACK = 2
#: How long a closed channel may take to close its sockets (gRPC does it on a thread of its own).
SETTLE = 30.0


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def sockets_to(port: int) -> int:
    """TCP connections of this process whose peer is ``port`` (the client ends only)."""
    mine = _socket_inodes()
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in mine:
                    count += 1
    return count


def settled_at_most(port: int, limit: int) -> int:
    """The process's sockets to ``port`` once they are ``limit`` or fewer (waits for closed
    channels to close theirs); fails after :data:`SETTLE` seconds."""
    margins.wait_until(lambda: sockets_to(port) <= limit, SETTLE, f"at most {limit} sockets to port {port}")
    return sockets_to(port)


@pytest.fixture
def broker(lb_address: str, stream_name: str) -> tuple[str, int]:
    """The broker's address and port, with ``stream_name`` holding three messages."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"a", b"b", b"c"])
    return lb_address, int(lb_address.rsplit(":", 1)[1])


def _stop_after_one(client: LiftbridgeClient, stream: str) -> None:
    for _ in client.subscribe(stream):
        break


def _raise_in_the_loop(client: LiftbridgeClient, stream: str) -> None:
    with pytest.raises(KeyError):
        for _ in client.subscribe(stream):
            raise KeyError("the caller's function failed")


def _time_out(client: LiftbridgeClient, stream: str) -> None:
    # read_committed's timed read: the watchdog thread cancels the call while this one reads it.
    from airflow_provider_liftbridge.client.subscription import read_committed

    assert len(client._transport.run(read_committed(client._core, stream, 0, 0, 5, 0.2))) == 3


@pytest.mark.parametrize(
    "stop", [_stop_after_one, _raise_in_the_loop, _time_out], ids=["break", "raise", "read-timeout"]
)
def test_a_blocking_subscription_stopped_early_keeps_no_connection(
    broker: tuple[str, int], stream_name: str, stop: Callable[[LiftbridgeClient, str], None]
) -> None:
    address, port = broker
    before = sockets_to(port)
    for _ in range(ROUNDS):
        with LiftbridgeClient(address) as client:
            stop(client, stream_name)
    assert settled_at_most(port, before + SLACK) <= before + SLACK


async def test_an_async_subscription_stopped_while_its_reader_thread_waits_keeps_no_connection(
    broker: tuple[str, int], stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader thread has filled its buffer and waits for room when the consumer stops: the
    cancel wakes it, and it must take in the call's cancelled status on its way out."""
    monkeypatch.setattr(async_transport, "BUFFER_HIGH", 2)
    monkeypatch.setattr(async_transport, "BUFFER_LOW", 1)
    address, port = broker
    before = sockets_to(port)
    for _ in range(ROUNDS):
        async with AsyncLiftbridgeClient(address, subscription_reader="thread") as client:
            messages = client.subscribe(stream_name, stop_at=StopPosition.LATEST)
            assert (await anext(messages)).offset == 0
            [stream] = client._transport._streams
            await margins.until(partial(getattr, stream, "paused"), SETTLE, "the reader thread to wait for room")
            await messages.aclose()  # type: ignore[attr-defined]  # an async generator
    await asyncio.to_thread(settled_at_most, port, before + SLACK)
    assert sockets_to(port) <= before + SLACK
