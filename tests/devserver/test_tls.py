"""The dev server's TLS option (``tls_cert_file`` / ``tls_key_file`` / ``tls_client_ca_file``), on both transports.

Certificates are generated here (a test CA, a server certificate for ``liftbridge.test``, a
client certificate); clients are grpcio secure channels and the project's client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.client import LiftbridgeClient, TlsConfig
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess, TlsConfigError
from tests.tls_certs import SERVER_NAME, make_certs

from .helpers import create, publish, subscribe

_NAME_OVERRIDE = [("grpc.ssl_target_name_override", SERVER_NAME)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("devserver-tls"))


def _creds(certs: dict[str, Path], *, client_cert: bool = True) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=certs["ca"].read_bytes(),
        private_key=certs["client_key"].read_bytes() if client_cert else None,
        certificate_chain=certs["client"].read_bytes() if client_cert else None,
    )


@pytest.fixture(scope="module", params=["h2", "aio"])
def mtls_server(request: pytest.FixtureRequest, certs: dict[str, Path]) -> Iterator[DevServer]:
    srv = DevServer(
        grpc_transport=request.param,
        tls_cert_file=certs["server"],
        tls_key_file=certs["server_key"],
        tls_client_ca_file=certs["ca"],
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_mutual_tls_round_trip_with_raw_stubs(mtls_server: DevServer, certs: dict[str, Path]) -> None:
    with grpc.secure_channel(mtls_server.address, _creds(certs), options=_NAME_OVERRIDE) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        create(stub, "tls-raw")
        assert publish(stub, "tls-raw", b"secret").ack.offset == 0
        got = subscribe(
            stub, pb.SubscribeRequest(stream="tls-raw", startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
        )
    assert got.handshake and [m.value for m in got.data] == [b"secret"]
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_mutual_tls_round_trip_with_the_project_client(mtls_server: DevServer, certs: dict[str, Path]) -> None:
    tls = TlsConfig(
        ca_file=str(certs["ca"]),
        cert_file=str(certs["client"]),
        key_file=str(certs["client_key"]),
        server_name=SERVER_NAME,
    )
    with LiftbridgeClient(mtls_server.address, tls=tls, timeout=5.0) as client:
        client.create_stream("tls-client", "tls-client")
        ack = client.publish("tls-client", b"one")
        assert ack is not None and ack.offset == 0
        assert [m.value for m in client.subscribe("tls-client", stop_at=0)] == [b"one"]


@pytest.mark.parametrize("who", ["no client certificate", "plaintext"])
def test_clients_without_a_valid_tls_setup_are_refused(
    mtls_server: DevServer, certs: dict[str, Path], who: str
) -> None:
    if who == "plaintext":
        channel = grpc.insecure_channel(mtls_server.address)
    else:
        channel = grpc.secure_channel(mtls_server.address, _creds(certs, client_cert=False), options=_NAME_OVERRIDE)
    with channel, pytest.raises(grpc.RpcError) as info:
        api_pb2_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_only_tls_accepts_clients_without_certificates(certs: dict[str, Path]) -> None:
    with DevServer(tls_cert_file=certs["server"], tls_key_file=certs["server_key"]) as srv:
        creds = _creds(certs, client_cert=False)
        with grpc.secure_channel(srv.address, creds, options=_NAME_OVERRIDE) as channel:
            meta = api_pb2_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=5)
    assert [b.id for b in meta.brokers] == ["broker-0"]


def test_incomplete_or_unusable_tls_settings_are_refused(certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="both a certificate file and its key file"):
        DevServer(tls_cert_file=certs["server"])
    with pytest.raises(TlsConfigError, match="needs the server's certificate"):
        DevServer(tls_client_ca_file=certs["ca"])
    with pytest.raises(TlsConfigError, match="cannot use the TLS files"):
        DevServer(tls_cert_file=tmp_path / "missing.pem", tls_key_file=certs["server_key"]).start()
    with pytest.raises(TlsConfigError, match="key matches the certificate"):
        DevServer(tls_cert_file=certs["server"], tls_key_file=certs["other_key"]).start()


def test_cli_serves_tls(certs: dict[str, Path], tmp_path: Path) -> None:
    proc = DevServerProcess(
        tmp_path / "data",
        tls_cert_file=certs["server"],
        tls_key_file=certs["server_key"],
        tls_client_ca_file=certs["ca"],
    )
    with proc:
        assert "tls=on" in proc.ready_line
        with grpc.secure_channel(proc.address, _creds(certs), options=_NAME_OVERRIDE) as channel:
            meta = api_pb2_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=5)
        assert len(meta.brokers) == 1


def test_cli_reports_bad_tls_settings(
    tmp_path: Path, certs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_provider_liftbridge.devserver.__main__ import main

    assert main(["--data-dir", str(tmp_path), "--port", "0", "--tls-cert", str(certs["server"])]) == 1
    err = capsys.readouterr().err
    assert err.startswith("liftbridge-devserver: error: TLS needs both a certificate file and its key file")
