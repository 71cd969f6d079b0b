"""TLS and mutual TLS against the dev server's TLS option (certificates generated in the test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import InvalidArgumentError, TlsConfig, UnavailableError
from airflow_provider_liftbridge.devserver import DevServer, DevServerTls
from tests.devserver.certs import SERVER_NAME, CertFiles, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_address(certs: CertFiles) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a dev server behind mutual TLS (client certificate required)."""
    with DevServer(tls=DevServerTls(certs.server, certs.server_key, client_ca_file=certs.ca)) as srv:
        yield srv.address


def _tls(certs: CertFiles, **overrides: Any) -> TlsConfig:
    args: dict[str, Any] = {
        "ca_file": str(certs.ca),
        "cert_file": str(certs.client),
        "key_file": str(certs.client_key),
        "server_name": SERVER_NAME,
    }
    args.update(overrides)
    return TlsConfig(**args)


def test_mutual_tls_round_trip(make_client: Any, tls_address: str, certs: CertFiles, stream_name: str) -> None:
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
    make_client: Any, tls_address: str, certs: CertFiles, overrides: dict[str, Any]
) -> None:
    c = make_client(tls_address, tls=_tls(certs, **overrides), timeout=2.0, max_retries=1, backoff_base=0.01)
    with pytest.raises(UnavailableError):
        c.fetch_metadata()


def test_plaintext_client_cannot_talk_to_a_tls_port(make_client: Any, tls_address: str) -> None:
    c = make_client(tls_address, timeout=2.0, max_retries=0)
    with pytest.raises(UnavailableError):
        c.fetch_metadata()


def test_bad_tls_settings_fail_at_construction(make_client: Any, certs: CertFiles, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="both cert_file and key_file"):
        make_client("127.0.0.1:1", tls=TlsConfig(cert_file=str(certs.client)))
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        make_client("127.0.0.1:1", tls=TlsConfig(ca_file=str(tmp_path / "missing.pem")))
