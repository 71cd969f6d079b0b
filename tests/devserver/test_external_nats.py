"""An external NATS given by URL, with credentials in the URL (user/password), as ``--nats-url`` takes it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator

import grpc
import nats
import pytest

from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import DevServer, NatsServerStartError
from airflow_provider_liftbridge.devserver.natsproc import find_nats_server

from .helpers import TIMEOUT, create


@pytest.fixture(scope="module")
def secured_nats() -> Iterator[int]:
    """A nats-server that requires user ``lb`` with password ``s3cret``; yields its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(
        [find_nats_server(), "-a", "127.0.0.1", "-p", str(port), "--user", "lb", "--pass", "s3cret"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def _publish_acked(url: str, subject: str) -> int:
    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(subject, new_message(b"v", ack_inbox=inbox))
        return unmarshal_ack((await sub.next_msg(timeout=TIMEOUT)).data).offset
    finally:
        await nc.close()


def test_credentials_in_the_nats_url_are_used(secured_nats: int, stream_name: str) -> None:
    url = f"nats://lb:s3cret@127.0.0.1:{secured_nats}"
    with DevServer(nats_url=url) as srv:
        assert srv.nats_pid is None  # not a child: nothing to watch or restart
        with grpc.insecure_channel(srv.address) as ch:
            create(api_pb2_grpc.APIStub(ch), stream_name)
        assert asyncio.run(_publish_acked(url, stream_name)) == 0


def test_wrong_nats_password_fails_start_without_showing_it(secured_nats: int) -> None:
    with pytest.raises(NatsServerStartError, match="Authorization Violation") as info:
        DevServer(nats_url=f"nats://lb:wrong@127.0.0.1:{secured_nats}").start()
    assert f"127.0.0.1:{secured_nats}" in str(info.value) and "wrong" not in str(info.value)
