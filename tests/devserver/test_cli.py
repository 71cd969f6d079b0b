"""``liftbridge-devserver`` / ``python -m airflow_provider_liftbridge.devserver``: ready line, signals, clear errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver.process import READY_PREFIX, parse_ready_line
from tests.processes import run_child

from .helpers import create, publish, subscribe

CMD = [sys.executable, "-m", "airflow_provider_liftbridge.devserver"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ready_line_serves_and_sigterm_stops_server_and_nats(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CMD, "--port", "0", "--nats-port", "0", "--brokers", "2", "--data-dir", str(tmp_path)]
        + ["--cursors-partitions", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert line.startswith(READY_PREFIX), line
        addresses, nats_url = parse_ready_line(line)
        assert len(addresses) == 2 and nats_url.startswith("nats://127.0.0.1:")
        with grpc.insecure_channel(addresses[1]) as ch:
            meta = api_pb2_grpc.APIStub(ch).FetchMetadata(pb.FetchMetadataRequest(), timeout=5)
        assert len(meta.brokers) == 2
        cursors = [s for s in meta.streamMetadata if s.name == "__cursors"]
        assert [sorted(s.partitions) for s in cursors] == [[0, 1, 2]]  # --cursors-partitions
        nats_port = int(nats_url.rsplit(":", 1)[1])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        with socket.socket() as sock:  # the nats-server child is gone too
            assert sock.connect_ex(("127.0.0.1", nats_port)) != 0
        assert (tmp_path / "meta.json").exists() or (tmp_path / "streams").is_dir()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_controlled_server_stops_when_its_controller_goes_away(tmp_path: Path) -> None:
    """With ``--control stdin`` the end of stdin (the controlling process died without stopping
    it) stops the server and its NATS child, as SIGTERM does: none is left behind."""
    proc = subprocess.Popen(
        [*CMD, "--port", "0", "--nats-port", "0", "--brokers", "2", "--data-dir", str(tmp_path), "--control", "stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        _, nats_url = parse_ready_line(proc.stdout.readline().strip())
        proc.stdin.write("metadata-leader\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok metadata-leader: 0"
        proc.stdin.close()
        assert proc.wait(30) == 0
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", int(nats_url.rsplit(":", 1)[1]))) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_port_in_use_is_one_clear_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_child([*CMD, "--port", str(port), "--nats-port", "0"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"port {port}" in result.stderr and "already in use" in result.stderr


def test_missing_nats_server_is_one_clear_line(tmp_path: Path) -> None:
    # A Python without nats-server next to it and nothing on PATH: run the module through a symlinked interpreter.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(fake_bin), "PYTHONPATH": os.pathsep.join(sys.path)}
    result = run_child(
        [str(fake_bin / "python"), "-m", "airflow_provider_liftbridge.devserver", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 1
    assert "nats-server binary not found" in result.stderr and "Traceback" not in result.stderr


def test_either_grpc_transport_serves_the_api(tmp_path: Path) -> None:
    from airflow_provider_liftbridge.devserver import DevServerProcess

    for transport in ("aio", "h2"):
        with DevServerProcess(tmp_path / transport, grpc_transport=transport) as proc:
            with grpc.insecure_channel(proc.address) as channel:
                stub = api_pb2_grpc.APIStub(channel)
                create(stub, "t")
                publish(stub, "t", transport.encode())
                got = subscribe(
                    stub, pb.SubscribeRequest(stream="t", startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
                )
                assert got.handshake and [m.value for m in got.data] == [transport.encode()]
                assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_unknown_grpc_transport_is_refused(tmp_path: Path) -> None:
    from airflow_provider_liftbridge.devserver import DevServer

    out = subprocess.run(
        [*CMD, "--grpc-transport", "http1", "--data-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "--grpc-transport: invalid choice: 'http1'" in out.stderr
    with pytest.raises(ValueError, match="unknown gRPC transport 'http1'; choose one of h2, aio"):
        DevServer(grpc_transport="http1")


def test_the_clock_command_stamps_a_streams_next_messages_in_the_past(tmp_path: Path) -> None:
    import datetime as dt

    from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition, StopPosition
    from airflow_provider_liftbridge.devserver import DevServerProcess
    from airflow_provider_liftbridge.devserver.errors import DevServerError

    at = dt.datetime(2026, 3, 2, 10, 5, tzinfo=dt.UTC)
    with DevServerProcess(tmp_path) as server, LiftbridgeClient(server.address) as client:
        client.create_stream("past", "past")
        client.create_stream("other", "other")
        server.set_reception_clock("past", at)
        client.publish("past", b"then")
        client.publish("other", b"now")
        server.set_reception_clock("past", None)
        client.publish("past", b"now")
        with pytest.raises(DevServerError, match="must be an aware datetime"):
            server.set_reception_clock("past", at.replace(tzinfo=None))

        def stamps(stream: str) -> list[dt.datetime]:
            found = client.subscribe(stream, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
            return [dt.datetime.fromtimestamp(m.timestamp / 1e9, dt.UTC) for m in found]

        (then, now), (other,) = stamps("past"), stamps("other")
    real = dt.datetime.now(dt.UTC)
    assert at <= then < at + dt.timedelta(minutes=1)  # the clock runs on from `at`
    assert abs(real - now) < dt.timedelta(minutes=5)  # back on the real clock
    assert abs(real - other) < dt.timedelta(minutes=5)  # another stream kept the real clock
