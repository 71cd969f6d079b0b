"""Errors raised by the dev server: one base class, one subclass per way starting or running it can fail."""

from __future__ import annotations


class DevServerError(RuntimeError):
    """Base class of every dev-server error. Each message names what went wrong and what to do."""


class NatsServerNotFoundError(DevServerError):
    """No ``nats-server`` binary next to the Python interpreter or on ``PATH``."""


class NatsServerStartError(DevServerError):
    """The ``nats-server`` child exited or did not become ready in time."""


class PortInUseError(DevServerError):
    """A port the server was asked to listen on is already taken."""


class DataDirError(DevServerError):
    """The data directory cannot be used (not writable, or holds unreadable metadata)."""


class TlsConfigError(DevServerError):
    """The TLS settings are incomplete, or a certificate, key or CA file cannot be used."""


class ServerStateError(DevServerError):
    """The server was used in a state that does not allow the call (not started, already stopped, ...)."""
