"""A nats-server child killed under a running dev server is restarted on the same port, and the NATS
ingest resumes: enveloped publishes are stored and acked again, subscribers keep receiving."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import nats

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess

from .helpers import TIMEOUT, create


def _wait_for(check: Callable[[], object], what: str, timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _acked_publish(nats_url: str, subject: str, value: bytes, timeout: float = 15.0) -> pb.Ack:
    """Publish an enveloped message and wait for its ack, re-sending every second until one comes
    (a publisher's way through a NATS outage); the first ack wins."""
    nc = await nats.connect(nats_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await nc.publish(subject, new_message(value, ack_inbox=inbox))
            try:
                return unmarshal_ack((await sub.next_msg(timeout=1.0)).data)
            except nats.errors.TimeoutError:
                continue
        raise AssertionError(f"no ack for the publish to {subject}")
    finally:
        await nc.close()


def _kill_nats_and_wait_restart(pid_of: Callable[[], int | None]) -> None:
    old = pid_of()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    _wait_for(lambda: pid_of() not in (None, old), "a new nats-server child")


def test_killed_nats_child_is_restarted_and_ingest_resumes(stream_name: str) -> None:
    with DevServer() as srv, grpc.insecure_channel(srv.address) as ch:
        stub = api_pb2_grpc.APIStub(ch)
        create(stub, stream_name)
        nats_url = srv.nats_url
        sub = stub.Subscribe(pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), timeout=30)
        assert next(sub).ByteSize() == 0  # the handshake
        assert asyncio.run(_acked_publish(nats_url, stream_name, b"before")).offset == 0
        assert next(sub).value == b"before"

        _kill_nats_and_wait_restart(lambda: srv.nats_pid)

        assert srv.nats_url == nats_url  # same port
        ack = asyncio.run(_acked_publish(nats_url, stream_name, b"after"))
        assert ack.offset >= 1  # a re-send may have landed twice; the first ack names the first copy
        assert next(sub).value == b"after"  # the subscriber that was there all along keeps receiving
        sub.cancel()
        # PublishToSubject goes through the new NATS too.
        resp = stub.PublishToSubject(pb.PublishToSubjectRequest(subject=stream_name, value=b"pts"), timeout=TIMEOUT)
        assert resp.ack.stream == stream_name


def test_killed_nats_grandchild_of_a_server_process_is_restarted(tmp_path: Path, stream_name: str) -> None:
    with DevServerProcess(tmp_path / "data") as proc, grpc.insecure_channel(proc.address) as ch:
        create(api_pb2_grpc.APIStub(ch), stream_name)
        assert asyncio.run(_acked_publish(proc.nats_url, stream_name, b"one")).offset == 0
        _kill_nats_and_wait_restart(lambda: proc.nats_pid)
        assert asyncio.run(_acked_publish(proc.nats_url, stream_name, b"two")).offset >= 1
        assert "restarting it" in proc.stderr_log.read_text()


def test_nats_pid_names_the_running_child(devserver: DevServer, tmp_path: Path) -> None:
    pid = devserver.nats_pid
    assert pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() == "nats-server"
    never_started = DevServerProcess(tmp_path / "never-started")
    try:
        assert never_started.nats_pid is None
    finally:
        never_started.close()
