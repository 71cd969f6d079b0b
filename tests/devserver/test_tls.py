"""The TLS option: TLS and mutual TLS on the gRPC ports (raw stubs over secure channels), and its errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess, DevServerTls, TlsConfigError

from .certs import SERVER_NAME, CertFiles, make_certs
from .helpers import TIMEOUT, create, publish, subscribe

_OVERRIDE = (("grpc.ssl_target_name_override", SERVER_NAME),)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("devserver-tls"))


def _channel(address: str, certs: CertFiles, *, client_cert: bool) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=certs.ca.read_bytes(),
        private_key=certs.client_key.read_bytes() if client_cert else None,
        certificate_chain=certs.client.read_bytes() if client_cert else None,
    )
    return grpc.secure_channel(address, creds, options=_OVERRIDE)


@pytest.fixture(scope="module")
def tls_server(certs: CertFiles) -> Iterator[DevServer]:
    """Server-side TLS only: any client that trusts the CA may call."""
    with DevServer(tls=DevServerTls(certs.server, certs.server_key)) as srv:
        yield srv


def test_tls_serves_publish_and_subscribe(tls_server: DevServer, certs: CertFiles, stream_name: str) -> None:
    with _channel(tls_server.address, certs, client_cert=False) as ch:
        stub = api_pb2_grpc.APIStub(ch)
        create(stub, stream_name)
        assert publish(stub, stream_name, b"over tls").ack.offset == 0
        req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
        got = subscribe(stub, req)
    assert [m.value for m in got.data] == [b"over tls"]
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_tls_port_refuses_plaintext(tls_server: DevServer) -> None:
    with grpc.insecure_channel(tls_server.address) as ch, pytest.raises(grpc.RpcError) as info:
        api_pb2_grpc.APIStub(ch).FetchMetadata(pb.FetchMetadataRequest(), timeout=2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate(certs: CertFiles) -> None:
    with DevServer(tls=DevServerTls(certs.server, certs.server_key, client_ca_file=certs.ca)) as srv:
        with _channel(srv.address, certs, client_cert=True) as ch:
            meta = api_pb2_grpc.APIStub(ch).FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT)
            assert [b.port for b in meta.brokers] == [int(srv.address.rsplit(":", 1)[1])]
        with _channel(srv.address, certs, client_cert=False) as ch, pytest.raises(grpc.RpcError) as info:
            api_pb2_grpc.APIStub(ch).FetchMetadata(pb.FetchMetadataRequest(), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unreadable_tls_files_fail_start_naming_the_file(certs: CertFiles, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TlsConfigError, match="nope.pem"):
        DevServer(tls=DevServerTls(certs.server, missing)).start()
    with pytest.raises(TlsConfigError, match="client CA"):
        DevServer(tls=DevServerTls(certs.server, certs.server_key, client_ca_file=certs.server_key)).start()


def test_cli_tls_key_without_cert_is_one_clear_line(certs: CertFiles) -> None:
    cmd = [sys.executable, "-m", "airflow_provider_liftbridge.devserver", "--port", "0", "--nats-port", "0"]
    result = subprocess.run([*cmd, "--tls-key", str(certs.server_key)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "liftbridge-devserver: error: --tls-cert and --tls-key go together: give both, or neither for plaintext"
    )


def test_process_with_mutual_tls(certs: CertFiles, tmp_path: Path, stream_name: str) -> None:
    tls = DevServerTls(certs.server, certs.server_key, client_ca_file=certs.ca)
    with DevServerProcess(tmp_path / "data", tls=tls) as proc:
        with _channel(proc.address, certs, client_cert=True) as ch:
            stub = api_pb2_grpc.APIStub(ch)
            create(stub, stream_name)
            assert publish(stub, stream_name, b"m").ack.offset == 0
        assert "tls=mutual" in proc.ready_line
