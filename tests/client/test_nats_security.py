"""NATS TLS and authentication, against a real nats-server started by the dev server with TLS,
mutual TLS, user/password, a token or an NKEY: every NATS path of the client (bulk publishing,
exactly-once over NATS, the standalone publisher and its ack inbox) connects with
``NatsSecurity``; without it the server refuses, and the error says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishError, UnavailableError
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver import DevServer, NatsServerSecurity
from airflow_provider_liftbridge.nats_security import NatsSecurity, NatsSecurityError, redact_url
from tests.tls_certs import SERVER_NAME, make_certs

if TYPE_CHECKING:
    from tests.nats_jwt import OperatorCredentials

pytestmark = pytest.mark.timeout(120)
PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {name: str(path) for name, path in make_certs(tmp_path_factory.mktemp("nats-certs")).items()}


@pytest.fixture(scope="module")
def nkey_seed(tmp_path_factory: pytest.TempPathFactory) -> str:
    nkeys = pytest.importorskip("nkeys")
    import nacl.signing

    raw = bytes(nacl.signing.SigningKey.generate())
    seed = nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER)
    path = tmp_path_factory.mktemp("nkey") / "user.nk"
    path.write_bytes(seed)
    return str(path)


def _modes(certs: dict[str, str], nkey_seed: str) -> dict[str, tuple[NatsServerSecurity, NatsSecurity, str]]:
    """mode -> (what the server demands, what a client must present, what a bare client is told)."""
    tls = NatsSecurity(tls_ca_file=certs["ca"], tls_server_name=SERVER_NAME)
    mtls = NatsSecurity(
        tls_ca_file=certs["ca"],
        tls_server_name=SERVER_NAME,
        tls_cert_file=certs["client"],
        tls_key_file=certs["client_key"],
    )
    server_tls = {"tls_cert_file": certs["server"], "tls_key_file": certs["server_key"]}
    return {
        "tls": (NatsServerSecurity(**server_tls, client=tls), tls, "TLS"),
        "mutual tls": (NatsServerSecurity(**server_tls, tls_client_ca_file=certs["ca"], client=mtls), mtls, "TLS"),
        "user/password": (
            NatsServerSecurity(
                user="airflow", password=PASSWORD, client=NatsSecurity(user="airflow", password=PASSWORD)
            ),
            NatsSecurity(user="airflow", password=PASSWORD),
            "refused the credentials",
        ),
        "token": (
            NatsServerSecurity(token=PASSWORD, client=NatsSecurity(token=PASSWORD)),
            NatsSecurity(token=PASSWORD),
            "refused the credentials",
        ),
        "nkey": (
            NatsServerSecurity(nkey_seed_file=nkey_seed, client=NatsSecurity(nkey_seed_file=nkey_seed)),
            NatsSecurity(nkey_seed_file=nkey_seed),
            "refused the credentials",
        ),
    }


@pytest.fixture(scope="module", params=["tls", "mutual tls", "user/password", "token", "nkey"])
def secured(
    request: pytest.FixtureRequest, certs: dict[str, str], nkey_seed: str
) -> Iterator[tuple[DevServer, NatsSecurity, str]]:
    server_side, client_side, refusal = _modes(certs, nkey_seed)[request.param]
    with DevServer(nats_security=server_side) as server:
        yield server, client_side, refusal


def test_bulk_and_exactly_once_publish_over_secured_nats(
    secured: tuple[DevServer, NatsSecurity, str], stream_name: str
) -> None:
    server, security, _ = secured
    with LiftbridgeClient(server.address, nats_servers=[server.nats_url], nats_security=security) as client:
        client.create_stream(stream_name, stream_name)
        acks = client.publish_many(stream_name, [b"a", b"b", b"c"], path="nats")
        assert [a.offset for a in acks] == [0, 1, 2]
        result = ExactlyOncePublisher(client, stream_name, "p", options=PublishOptions(path="nats")).publish(
            [b"d", b"e"]
        )
        assert result.written == 2
        assert client.fetch_partition_metadata(stream_name, 0).newest_offset == 4


async def test_publisher_and_ack_inbox_over_secured_nats(
    secured: tuple[DevServer, NatsSecurity, str], stream_name: str
) -> None:
    server, security, _ = secured
    with LiftbridgeClient(server.address) as client:
        client.create_stream(stream_name, stream_name)
    async with await NatsPublisher.connect([server.nats_url], security=security) as publisher:
        acks = await publisher.publish_many(stream_name, [b"x", b"y"])
    assert [a.offset for a in acks] == [0, 1]


async def test_without_security_the_server_refuses_and_says_why(
    secured: tuple[DevServer, NatsSecurity, str],
) -> None:
    server, _, refusal = secured
    url = server.nats_url.replace("tls://", "nats://")
    with pytest.raises(UnavailableError, match=refusal):
        await NatsPublisher.connect([url], connect_timeout=2)


def test_repr_and_urls_hide_secrets() -> None:
    security = NatsSecurity(user="u", password=PASSWORD)
    assert PASSWORD not in repr(security) and "password='***'" in repr(security)
    assert PASSWORD not in repr(NatsSecurity(token=PASSWORD))
    assert redact_url(f"nats://u:{PASSWORD}@h:4222,nats://h2:4222") == "nats://***@h:4222,nats://h2:4222"
    client = LiftbridgeClient("127.0.0.1:1", nats_servers=[f"nats://u:{PASSWORD}@h:4222"])
    try:
        assert PASSWORD not in repr(client)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tls_cert_file": "/c.pem"}, "tls_key_file is missing"),
        ({"user": "u"}, "password is missing"),
        ({"token": "t", "user": "u", "password": "p"}, "one form of authentication"),
    ],
)
def test_bad_security_is_named(kwargs: dict[str, str], words: str) -> None:
    with pytest.raises(NatsSecurityError, match=words):
        NatsSecurity(**kwargs)


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(NatsSecurityError, match="CA file"):
        NatsSecurity(tls_ca_file=str(tmp_path / "missing.pem")).connect_options()
    with pytest.raises(NatsSecurityError, match="credentials_file"):
        NatsSecurity(credentials_file=str(tmp_path / "missing.creds")).connect_options()


def test_auto_path_reports_a_refusal_instead_of_falling_back(
    secured: tuple[DevServer, NatsSecurity, str], stream_name: str
) -> None:
    # Unreachable NATS falls back to gRPC (test_bulk); refused credentials or TLS are a setting
    # to fix, which a silent fallback would hide on every run.
    server, _, refusal = secured
    url = server.nats_url.replace("tls://", "nats://")
    with LiftbridgeClient(server.address) as client:
        client.create_stream(stream_name, stream_name)
    # A short client timeout: nats-py only gives up on a plain connection to a TLS server at the
    # connect deadline (about twice the timeout).
    with LiftbridgeClient(server.address, nats_servers=[url], timeout=1) as client:
        with pytest.raises(PublishError, match=refusal):
            client.publish_many(stream_name, [b"a"])
    with LiftbridgeClient(server.address) as client:
        assert client.fetch_partition_metadata(stream_name, 0).newest_offset == -1


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevServer, OperatorCredentials]]:
    """A dev server whose nats-server runs in operator mode (JWT accounts, in-memory resolver); the
    dev server itself connects with the user's .creds file."""
    pytest.importorskip("nkeys")
    from tests.nats_jwt import make_operator_credentials

    creds = make_operator_credentials(tmp_path_factory.mktemp("nats-operator"))
    server_side = NatsServerSecurity(
        operator_jwt=creds.operator_jwt,
        account_jwts=(creds.account_jwt,),
        client=NatsSecurity(credentials_file=str(creds.creds_file)),
    )
    with DevServer(nats_security=server_side) as server:
        yield server, creds


async def test_creds_file_publishes_with_ack_inbox_in_operator_mode(
    operator_mode: tuple[DevServer, OperatorCredentials], stream_name: str
) -> None:
    server, creds = operator_mode
    security = NatsSecurity(credentials_file=str(creds.creds_file))
    with LiftbridgeClient(server.address) as client:
        client.create_stream(stream_name, stream_name)
    async with await NatsPublisher.connect([server.nats_url], security=security) as publisher:
        acks = await publisher.publish_many(stream_name, [b"x", b"y", b"z"])
    assert [a.offset for a in acks] == [0, 1, 2]
    with LiftbridgeClient(server.address, nats_servers=[server.nats_url], nats_security=security) as client:
        assert [a.offset for a in client.publish_many(stream_name, [b"w"], path="nats")] == [3]


@pytest.mark.parametrize("who", ["no credentials", "user of an unknown account"])
async def test_operator_mode_refuses_without_valid_creds(
    operator_mode: tuple[DevServer, OperatorCredentials], who: str
) -> None:
    server, creds = operator_mode
    security = None if who == "no credentials" else NatsSecurity(credentials_file=str(creds.stranger_creds_file))
    with pytest.raises(UnavailableError, match="refused the credentials"):
        await NatsPublisher.connect([server.nats_url], security=security, connect_timeout=2)


def test_nats_servers_none_means_none() -> None:
    with LiftbridgeClient("127.0.0.1:1", nats_servers=None) as client:
        assert client.nats_servers == ()
