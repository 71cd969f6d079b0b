"""TLS and mutual TLS against the real API served over a TLS port.

The dev server has no TLS option, so the test serves the dev server's own ``ApiService`` (the
real gRPC API on the same store and NATS) on an extra ``grpc.aio`` TLS port on the dev server's
loop, with certificates generated here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import InvalidArgumentError, TlsConfig, UnavailableError
from airflow_provider_liftbridge.devserver import DevServer
from tests.tls_certs import SERVER_NAME, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_address(certs: dict[str, Path]) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a dev server behind mutual TLS (client certificate required)."""
    with DevServer(
        tls_cert_file=certs["server"], tls_key_file=certs["server_key"], tls_client_ca_file=certs["ca"]
    ) as srv:
        yield srv.address


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
