"""Dropping the client's NATS connection after a failed batch (``NatsLink.discard``, used by both
clients' transports): a flush that proves every publish handled, else a reset. Against the
session dev server's nats-server; the same through a slow or cut link is in
``tests/reliability/test_nats_reset.py``.

The first test is the tripwire for nats-py upgrades: the reset needs the TCP socket under
nats-py's transport (``nats_adapter.tcp_socket``), and without it falls back to a plain close,
whose data the kernel keeps sending (exactly-once would store records twice on a slow link).
"""

from __future__ import annotations

import socket
import struct
import uuid

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge.client.transport.nats import NatsLink, connect_nats
from tests.margins import until


async def test_the_socket_under_nats_py_is_found_and_reset(nats_url: str) -> None:
    nc = await connect_nats(nats_url)
    try:
        found = nats_adapter.tcp_socket(nc)
        assert found is not None, "nats-py's transport changed: NatsLink.discard can no longer reset a connection"
        sock, _ = found
        assert sock.type == socket.SOCK_STREAM
        assert nats_adapter.reset_on_close(nc)
        assert struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)) == (1, 0)
        assert nats_adapter.reset_on_close(nc, on=False)
        assert struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))[0] == 0
        await nc.publish("nowhere", b"x" * 100_000)
        assert nats_adapter.abort(nc)
        assert nc._pending_data_size == 0  # nats-py's own buffer dropped, not written by close()
        await until(lambda: nats_adapter.tcp_socket(nc) is None or sock.fileno() == -1, 10, "the socket to close")
    finally:
        await nc.close()
    assert nc.is_closed


async def test_discard_flushes_a_healthy_connection(nats_url: str) -> None:
    subject = f"discard-{uuid.uuid4().hex}"
    watcher = await connect_nats(nats_url)
    link = NatsLink([nats_url], connect_timeout=5.0)
    try:
        sub = await watcher.subscribe(
            subject,
        )
        await nats_adapter.flush(watcher)
        nc = await link.get()
        for i in range(200):
            await nc.publish(subject, str(i).encode())
        assert await link.discard(flush_within=10.0) is True
        assert nc.is_closed
        # The PONG came after NATS handled every PUB: each is queued to the watcher ahead of its own PONG.
        await nats_adapter.flush(watcher)
        assert sub.delivered == 200
        await sub.unsubscribe()
        # A new connection next time; nothing to vouch for when none was used since.
        assert (await link.get()) is not nc
        assert await link.discard(flush_within=0.0) is False  # reset at once: not known delivered
        assert await link.discard(flush_within=10.0) is True
    finally:
        await link.close()
        await watcher.close()


async def test_a_connection_nats_py_closed_itself_is_not_vouched_for(nats_url: str) -> None:
    # Lost and closed by nats-py (here: closed under the link), then reopened by get(): what the
    # lost one held may still be on its way, whatever the new one's flush says.
    link = NatsLink([nats_url], connect_timeout=5.0)
    try:
        first = await link.get()
        await first.close()
        assert (await link.get()) is not first
        assert await link.discard(flush_within=10.0) is False
    finally:
        await link.close()
