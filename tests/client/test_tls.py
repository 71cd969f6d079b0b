"""TLS and mutual TLS against the real API served over a TLS port.

The dev server has no TLS option, so the test serves the dev server's own ``ApiService`` (the
real gRPC API on the same store and NATS) on an extra ``grpc.aio`` TLS port on the dev server's
loop, with certificates generated here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc import aio

from airflow_provider_liftbridge.client import InvalidArgumentError, TlsConfig, UnavailableError
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.devserver.service import ApiService

SERVER_NAME = "liftbridge.test"


def _cert(subject: str, key: Any, issuer: tuple[x509.Name, Any] | None, *, ca: bool, san: str | None = None) -> Any:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj: Any) -> bytes:
    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(  # type: ignore[no-any-return]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    return obj.public_bytes(serialization.Encoding.PEM)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca=True)
    files: dict[str, Any] = {"ca": ca}
    for who, san in (("server", SERVER_NAME), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        files[who] = _cert(who, key, (ca.subject, ca_key), ca=False, san=san)
        files[f"{who}_key"] = key
    out = {}
    for name, obj in files.items():
        path = d / f"{name}.pem"
        path.write_bytes(_pem(obj))
        out[name] = path
    return out


@pytest.fixture(scope="module")
def tls_address(certs: dict[str, Path]) -> Iterator[str]:
    """``127.0.0.1:PORT`` of the real API behind mutual TLS (client certificate required)."""
    srv = DevServer(brokers=1)
    srv.start()
    core = srv._core  # test-only: reuse the running server's store and NATS ingest
    assert core is not None
    holder: dict[str, Any] = {}

    async def serve() -> int:
        server = aio.server()
        server.add_generic_rpc_handlers((ApiService(core.store, core._ingest, core.brokers[0]).handler(),))
        creds = grpc.ssl_server_credentials(
            [(certs["server_key"].read_bytes(), certs["server"].read_bytes())],
            root_certificates=certs["ca"].read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        holder["server"] = server
        # Advertise the TLS port in metadata, so leader-routed calls (Subscribe) dial it too.
        core.brokers[0].port = port
        return port

    try:
        port = srv._run(serve())
        yield f"127.0.0.1:{port}"
        srv._run(holder["server"].stop(None))
    finally:
        srv.stop()


def _tls(certs: dict[str, Path], **overrides: Any) -> TlsConfig:
    args = {
        "ca_file": str(certs["ca"]),
        "cert_file": str(certs["client"]),
        "key_file": str(certs["client_key"]),
        "server_name": SERVER_NAME,
    }
    args.update(overrides)
    return TlsConfig(**args)


def test_mutual_tls_round_trip(make_client: Any, tls_address: str, certs: dict[str, Path], stream_name: str) -> None:
    c = make_client(tls_address, tls=_tls(certs), timeout=5.0)
    c.create_stream(stream_name, stream_name)
    assert c.publish(stream_name, b"secret").offset == 0
    assert [m.value for m in c.subscribe(stream_name, stop_at=0)] == [b"secret"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"cert_file": None, "key_file": None},  # the server requires a client certificate
        {"server_name": "someone-else.test"},  # the certificate does not match the name
        {"ca_file": None},  # the test CA is not a system root
    ],
)
def test_tls_refusals_surface_as_unavailable(
    make_client: Any, tls_address: str, certs: dict[str, Path], overrides: dict[str, Any]
) -> None:
    c = make_client(tls_address, tls=_tls(certs, **overrides), timeout=2.0, max_retries=1, backoff_base=0.01)
    with pytest.raises(UnavailableError):
        c.fetch_metadata()


def test_plaintext_client_cannot_talk_to_a_tls_port(make_client: Any, tls_address: str) -> None:
    c = make_client(tls_address, timeout=2.0, max_retries=0)
    with pytest.raises(UnavailableError):
        c.fetch_metadata()


def test_bad_tls_settings_fail_at_construction(make_client: Any, certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="both cert_file and key_file"):
        make_client("127.0.0.1:1", tls=TlsConfig(cert_file=str(certs["client"])))
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        make_client("127.0.0.1:1", tls=TlsConfig(ca_file=str(tmp_path / "missing.pem")))
