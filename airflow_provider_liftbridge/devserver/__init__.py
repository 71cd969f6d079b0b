"""A Liftbridge-compatible server (gRPC API on a real nats-server) for local work and tests.

``DevServer`` runs it in this process on a background thread; ``DevServerProcess`` runs it
as a child process (for crash and restart tests); ``liftbridge-devserver`` is the command.
See docs/devserver.md.
"""

from __future__ import annotations

from .clock import set_reception_clock
from .errors import (
    DataDirError,
    DevServerError,
    NatsServerNotFoundError,
    NatsServerStartError,
    PortInUseError,
    ServerStateError,
    TlsConfigError,
)
from .model import ClusterTimings
from .natsproc import NatsServerSecurity
from .process import DevServerProcess
from .server import DevServer

__all__ = [
    "ClusterTimings",
    "DataDirError",
    "DevServer",
    "DevServerError",
    "DevServerProcess",
    "NatsServerNotFoundError",
    "NatsServerSecurity",
    "NatsServerStartError",
    "PortInUseError",
    "ServerStateError",
    "TlsConfigError",
    "set_reception_clock",
]
