"""Errors of the dev server: :class:`DevServerError` and one subclass per way starting or running it
can fail (what users of ``DevServer`` catch), and the API's refusals (:class:`ApiError`,
:class:`ExpectedOffsetRefused`), which the service turns into gRPC statuses."""

from __future__ import annotations

import grpc


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


class ApiError(Exception):
    """A refusal the API turns into a gRPC status (and, on PublishAsync, into an async error).

    :param code: the gRPC status code.
    :param message: the status message, worded as the real server words it.
    :param async_code: the ``PublishAsyncError.Code`` for the same refusal on PublishAsync.
    """

    def __init__(self, code: grpc.StatusCode, message: str, async_code: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.async_code = async_code


class ExpectedOffsetRefused(Exception):
    """An expected offset did not match on a stream with optimistic concurrency control (the
    server's refusal; the client's error for it is ``client.IncorrectOffsetError``)."""
