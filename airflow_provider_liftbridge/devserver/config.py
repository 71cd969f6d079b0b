"""What a dev server listens on and where it keeps its data: :class:`ServerConfig` and the gRPC transports."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TlsConfigError
from .groups import DEFAULT_GROUP_TIMEOUT
from .grpc_h2 import server_ssl_context
from .model import ClusterTimings
from .natsproc import NatsServerSecurity

#: The gRPC transports the dev server can serve its API with (see docs/devserver.md, ADR 5).
GRPC_TRANSPORTS = ("h2", "aio")
#: Environment variable that changes the default transport (for running a test suite on ``aio``).
TRANSPORT_ENV = "LIFTBRIDGE_DEVSERVER_GRPC_TRANSPORT"
#: ``cursors.stream.partitions`` of the dev server unless told otherwise (the value the project's
#: docs ask a real cluster for; a stock Liftbridge has 0, cursors off).
DEFAULT_CURSORS_PARTITIONS = 1


def default_transport() -> str:
    """The transport used when none is given: ``$LIFTBRIDGE_DEVSERVER_GRPC_TRANSPORT``, else ``h2``."""
    return os.environ.get(TRANSPORT_ENV) or "h2"


@dataclass
class ServerConfig:
    """What a dev server listens on and where it keeps its data.

    :param data_dir: directory of the logs and metadata (created if missing).
    :param host: address the gRPC brokers (and a NATS child) listen on.
    :param ports: one gRPC port per broker; 0 picks a free port.
    :param nats_url: use this NATS server instead of starting a child.
    :param nats_port: port of the NATS child; 0 picks a free port.
    :param fsync: fsync every log write (default: page cache only, which survives a process kill).
    :param grpc_transport: ``"h2"`` (asyncio + the ``h2`` library, coalesced writes) or ``"aio"``
        (``grpc.aio``); ``None`` means :func:`default_transport`.
    :param tls_cert_file: PEM certificate (chain) of the gRPC ports; with ``tls_key_file``, serves TLS only.
    :param tls_key_file: PEM private key of that certificate.
    :param tls_client_ca_file: PEM CA bundle; when given, clients must present a certificate it signed (mTLS).
    :param groups_consumer_timeout: seconds a consumer-group member may go without fetching its
        assignments before it is removed (Liftbridge's ``groups.consumer.timeout``).
    :param groups_coordinator_timeout: seconds within which a majority of a group's members must report
        its coordinator for a failover (Liftbridge's ``groups.coordinator.timeout``).
    :param timings: cluster-mode time-outs, minimum ISR and restart window (more than one broker);
        ``None`` means Liftbridge's defaults (:class:`~.replication.ClusterTimings`).
    :param cursors: serve SetCursor/FetchCursor; ``False`` answers them as a stock Liftbridge with
        ``cursors.stream.partitions: 0`` does (INTERNAL "Cursors stream does not exist").
    :param cursors_partitions: partitions of the internal ``__cursors`` stream created on a new data
        directory (Liftbridge's ``cursors.stream.partitions``; ``cursors=False`` means 0).
    :param nats_security: TLS and authentication of the NATS child, and (its ``client``) how the
        dev server connects to NATS (also to an external ``nats_url``).
    :raises ValueError: an unknown transport.
    :raises TlsConfigError: a certificate without a key (or the reverse), or a client CA without them.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    ports: list[int] = field(default_factory=lambda: [0])
    nats_url: str | None = None
    nats_port: int = 0
    fsync: bool = False
    grpc_transport: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    groups_consumer_timeout: float = DEFAULT_GROUP_TIMEOUT
    groups_coordinator_timeout: float = DEFAULT_GROUP_TIMEOUT
    timings: ClusterTimings | None = None
    cursors: bool = True
    cursors_partitions: int = DEFAULT_CURSORS_PARTITIONS
    nats_security: NatsServerSecurity | None = None

    def __post_init__(self) -> None:
        if self.grpc_transport is None:
            self.grpc_transport = default_transport()
        if self.grpc_transport not in GRPC_TRANSPORTS:
            raise ValueError(
                f"unknown gRPC transport {self.grpc_transport!r}; choose one of {', '.join(GRPC_TRANSPORTS)}"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise TlsConfigError("TLS needs both a certificate file and its key file; give both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise TlsConfigError("a client CA (mutual TLS) needs the server's certificate and key files too")

    @property
    def tls(self) -> bool:
        """Whether the gRPC ports serve TLS."""
        return bool(self.tls_cert_file)

    def ssl_context(self) -> ssl.SSLContext:
        """The server TLS context (ALPN ``h2``), checked by loading every file.

        :raises TlsConfigError: a file is missing or unreadable, or the key does not match the certificate.
        """
        assert self.tls_cert_file and self.tls_key_file
        try:
            return server_ssl_context(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"cannot use the TLS files (cert {self.tls_cert_file}, key {self.tls_key_file}, "
                f"client CA {self.tls_client_ca_file}): {exc}; check the paths and that the key matches the certificate"
            ) from exc
