"""A dead nats-server child is restarted on its port, and NATS ingest resumes (real processes, SIGKILL)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from tests import margins
from tests.margins import bounded

from .helpers import TIMEOUT, create, subscribe

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the child through /proc")


def _nats_children(parent: int | None = None) -> set[int]:
    """Pids of the running nats-server children of ``parent`` (default: this process), read from /proc."""
    pids = set()
    for children in Path(f"/proc/{parent or os.getpid()}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if comm == "nats-server" and state != "Z":
                pids.add(int(pid))
    return pids


async def _until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    await margins.until(condition, timeout, what, interval=0.02, where=margins.caller())


async def test_supervised_child_is_restarted_on_the_same_port() -> None:
    proc = NatsServerProcess()
    url = proc.start()
    try:
        proc.supervise(check_every=0.02)
        first = proc.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await _until(lambda: proc.restarts == 1 and proc.alive, "the child was restarted")
        assert proc.url == url and proc.pid != first
        nc = await nats_adapter.connect(url, connect_timeout=2, allow_reconnect=False)
        await nc.flush()  # it accepts clients
        await nc.close()
    finally:
        proc.stop()
    assert not proc.alive and proc.pid is None


async def test_supervision_gives_up_after_bounded_attempts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="airflow_provider_liftbridge.devserver.natsproc")
    proc = NatsServerProcess()
    proc.start()
    blocker = socket.socket()
    try:
        # Checked rarely, so that the port can be taken between the death and the restart.
        proc.supervise(check_every=0.5, max_attempts=3, backoff=0.01, max_backoff=0.02)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        with bounded("the killed child's port", 5):
            deadline = time.monotonic() + 5
            while True:
                try:
                    blocker.bind((proc.host, proc.port))
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the killed child never released its port"
                    await asyncio.sleep(0.01)
        blocker.listen()
        await _until(lambda: "gave up restarting nats-server" in caplog.text, "the supervisor gave up")
        assert caplog.text.count("restarting nats-server failed") == 3
        assert "is already in use" in caplog.text
        assert proc.restarts == 0 and not proc.alive
    finally:
        blocker.close()
        proc.stop()


async def test_stop_ends_supervision() -> None:
    proc = NatsServerProcess()
    proc.start()
    proc.supervise(check_every=0.02)
    pid = proc.pid
    proc.stop()
    await asyncio.sleep(0.2)
    assert not proc.alive and proc.restarts == 0 and pid not in _nats_children()


def test_supervise_needs_a_started_child() -> None:
    with pytest.raises(Exception, match="start the nats-server child before supervising it"):
        NatsServerProcess().supervise()


async def _publish_until_acked(nc: Client, subject: str, values: list[bytes]) -> dict[bytes, int]:
    """Publish enveloped ``values`` with acks, re-sending the unacked ones every second (as a
    publisher does after an outage) until each is acked; return value -> acked offset."""
    inbox = nc.new_inbox()
    acked: dict[bytes, int] = {}
    by_cid = {str(i): v for i, v in enumerate(values)}

    async def on_ack(msg: Msg) -> None:
        ack = unmarshal_ack(msg.data)
        assert ack.ackError == pb.Ack.OK
        acked.setdefault(by_cid[ack.correlationId], ack.offset)

    sub = await nc.subscribe(inbox, cb=on_ack)
    with bounded("every value acked", 20):
        deadline = time.monotonic() + 20
        while len(acked) < len(values):
            assert time.monotonic() < deadline, f"only {len(acked)} of {len(values)} acked"
            for cid, value in by_cid.items():
                if value not in acked:
                    await nc.publish(subject, new_message(value, ack_inbox=inbox, correlation_id=cid))
            try:
                await nc.flush(timeout=1)
            except Exception:  # still reconnecting
                pass
            await asyncio.sleep(0.3)
    await sub.unsubscribe()
    return acked


async def test_killed_nats_child_is_restarted_and_ingest_resumes(tmp_path: Path, stream_name: str) -> None:
    others = _nats_children()
    with DevServer(data_dir=tmp_path / "data") as srv:
        with grpc.insecure_channel(srv.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            create(stub, stream_name)
            nc = await nats_adapter.connect(srv.nats_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
            try:
                before = await _publish_until_acked(nc, stream_name, [b"before-%d" % i for i in range(50)])
                (child,) = _nats_children() - others
                os.kill(child, signal.SIGKILL)
                await _until(lambda: _nats_children() - others - {child}, "a new nats-server child runs")
                after = await _publish_until_acked(nc, stream_name, [b"after-%d" % i for i in range(50)])
            finally:
                await nc.close()
            stored = subscribe(
                stub,
                pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST),
                timeout=TIMEOUT,
            ).data
    by_offset = {m.offset: m.value for m in stored}
    assert [m.offset for m in stored] == list(range(len(stored)))
    # Nothing acked before the kill is lost, and the acks after it point at what they acked.
    assert before == {b"before-%d" % i: i for i in range(50)}
    assert all(by_offset[offset] == value for value, offset in after.items())


async def test_the_command_line_server_restarts_its_child_too(tmp_path: Path) -> None:
    with DevServerProcess(tmp_path / "data") as srv, grpc.insecure_channel(srv.address) as channel:
        assert srv.pid is not None
        stub = api_pb2_grpc.APIStub(channel)
        create(stub, "cli")
        nc = await nats_adapter.connect(srv.nats_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        try:
            before = await _publish_until_acked(nc, "cli", [b"b%d" % i for i in range(20)])
            (child,) = _nats_children(srv.pid)
            os.kill(child, signal.SIGKILL)
            await _until(lambda: _nats_children(srv.pid) - {child}, "the server started a new nats-server")
            after = await _publish_until_acked(nc, "cli", [b"a%d" % i for i in range(20)])
        finally:
            await nc.close()
        stored = {m.offset: m.value for m in subscribe(stub, _everything("cli")).data}
        log = srv.stderr_log.read_text()
    assert all(stored[offset] == value for value, offset in (before | after).items())
    assert "restarting it on the same port" in log and "partition subscriptions renewed" in log


def _everything(stream: str) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
