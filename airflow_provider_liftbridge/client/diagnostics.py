"""Why a broker or a NATS server could not be used, in words a user can act on.

gRPC reports a distinct cause for each way a connection fails ("Connection refused", "Domain
name not found", "Tls handshake failed ... WRONG_VERSION_NUMBER", "Failed parsing HTTP/2", ...)
but buries it in a long status text. :func:`explain_unreachable` picks the cause out and pairs it
with what to check; :func:`sniff_protocol` tells a NATS port or an HTTP server from a broker by
reading what the port says (the connection Test uses it to name the port's real use).

Also here: how a stock Liftbridge says cursors are off (:func:`is_cursors_disabled`) and the
typed error for it (:func:`cursors_disabled_error`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from airflow_provider_liftbridge.nats_security import redact_urls

from .errors import CursorsDisabledError, UnavailableError

__all__ = [
    "NatsErrors",
    "Unreachable",
    "cursors_disabled_error",
    "explain_unreachable",
    "is_cursors_disabled",
    "is_nats_refusal",
    "probe_port",
    "nats_connect_error",
    "sniff_protocol",
    "unavailable_error",
]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unreachable:
    """One cause of a failed connection.

    :ivar cause: what happened, short ("connection refused").
    :ivar check: what to check or change.
    """

    cause: str
    check: str

    def __str__(self) -> str:
        return f"{self.cause}; {self.check}"


#: (substrings of gRPC's status text, lower case; cause; what to check), first match wins.
_CAUSES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("connection refused",),
        "connection refused",
        "nothing listens on this host and port: check that the broker runs there and the port is the"
        " broker's client port (Liftbridge's default is 9292)",
    ),
    (
        ("domain name not found", "name or service not known", "address lookup failed", "dns resolution failed"),
        "unknown host name",
        "check the host name's spelling and that this machine can resolve it (DNS, /etc/hosts)",
    ),
    (
        ("wrong_version_number",),
        "TLS handshake failed: the server does not speak TLS",
        "switch 'Use TLS' off (tls=None), or enable TLS on the broker",
    ),
    (
        ("certificate_verify_failed", "certificate verify failed", "unable to get local issuer"),
        "TLS handshake failed: the broker's certificate was not accepted",
        "set 'TLS CA file' to the CA that signed the broker's certificate, and 'TLS server name' if the"
        " certificate names another host",
    ),
    (
        ("tls handshake failed", "ssl_error", "handshake failed"),
        "TLS handshake failed",
        "check the TLS CA file, the client certificate and key, and the TLS server name",
    ),
    (
        ("http1.x server",),
        "an HTTP/1 server answered, not a Liftbridge broker",
        "this is a web port: give the broker's client port (default 9292)",
    ),
    (
        ("failed parsing http/2", "expected settings frame"),
        "the server does not speak the Liftbridge API (a NATS port, or another protocol)",
        "give the broker's client port (default 9292); NATS URLs (port 4222) belong in 'NATS servers'",
    ),
    (
        ("socket closed", "connection reset", "end of tcp stream", "broken pipe"),
        "the server closed the connection",
        "if the broker requires TLS, switch 'Use TLS' on; otherwise check that this is a Liftbridge broker",
    ),
    (
        ("timed out", "timeout", "deadline"),
        "no answer in time",
        "check that the host is reachable from here (firewall, routing) and the port is right",
    ),
)


def explain_unreachable(details: str) -> Unreachable | None:
    """The cause in gRPC's status text ``details`` and what to check, or ``None`` if none is known."""
    low = details.lower()
    for needles, cause, check in _CAUSES:
        if any(n in low for n in needles):
            return Unreachable(cause, check)
    return None


def unavailable_error(method: str, details: str, *, attempts: int, tried: Sequence[str]) -> UnavailableError:
    """The error of a call no broker answered, naming gRPC's cause and what to check.

    ``max_retries`` is suggested only when the call was retried: with no retries (the connection
    Test) more retries would not have been tried anyway.
    """
    brokers = ", ".join(dict.fromkeys(tried)) if tried else "the known brokers"  # each once, in order
    found = explain_unreachable(details)
    # gRPC's raw text (addresses, subchannel states) stays out of the message; it is in .cause.
    why = f": {found}" if found is not None else "; check that the brokers are running and the addresses are right"
    retry = "; if brokers are only restarting, raise max_retries" if attempts > 1 else ""
    return UnavailableError(
        f"{method} failed: no broker reachable after {attempts} attempt(s) ({brokers}){why}{retry}.",
        cause=details,
    )


def sniff_protocol(host: str, port: int, timeout: float = 1.0) -> str | None:
    """What answers on ``host:port``, judged by its first bytes: ``"nats"`` (a NATS server greets
    with ``INFO``), ``"http"`` (answers a request with ``HTTP/``), or ``None`` (unknown, silent
    or unreachable). Never raises."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            try:
                first = sock.recv(8)
            except TimeoutError:
                first = b""
            if first.startswith(b"INFO"):
                return "nats"
            if not first:
                sock.sendall(b"GET / HTTP/1.0\r\nHost: liftbridge-test\r\n\r\n")
                first = sock.recv(8)
            return "http" if first.startswith(b"HTTP/") else None
    except OSError:
        return None


def probe_port(host: str, port: int, timeout: float = 1.0) -> Literal["open", "refused", "silent"]:
    """What a TCP connection to ``host:port`` meets: ``"open"`` (accepted: a running process, or a
    stopped (SIGSTOP) one, whose kernel still accepts connections), ``"refused"`` (refused or reset
    at once: nothing listens, the process is gone together with whatever it had received but not
    read), or ``"silent"`` (no answer within ``timeout``: the host is down or cut off). Never raises."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except (ConnectionRefusedError, ConnectionResetError):
        return "refused"
    except OSError:
        return "silent"


#: (substrings of nats-py's error text, lower case; cause; what to check; whether the server was
#: reached and refused this client: credentials or TLS), first match wins.
_NATS_CAUSES: tuple[tuple[tuple[str, ...], str, str, bool], ...] = (
    (
        ("authorization violation", "authentication", "user authentication"),
        "the NATS server refused the credentials",
        "check 'NATS user' / 'NATS password', 'NATS token', the NKEY seed or the credentials file",
        True,
    ),
    (
        ("tls required", "requires tls", "tls_required"),
        "the NATS server requires TLS",
        "switch 'Use TLS for NATS' on (or use a tls:// URL) and set the NATS TLS CA file",
        True,
    ),
    (
        ("certificate verify failed", "certificate_verify_failed"),
        "TLS handshake failed: the NATS server's certificate was not accepted",
        "set 'NATS TLS CA file' to the CA that signed it, and 'NATS TLS server name' if it names another host",
        True,
    ),
    (
        ("wrong version number", "wrong_version_number", "ssl", "tls"),
        "TLS handshake with NATS failed",
        "check 'Use TLS for NATS' against the server's TLS setting, and the NATS TLS files",
        True,
    ),
    (
        ("connection refused", "connect call failed"),
        "connection refused",
        "nothing listens there: check the NATS host and port (NATS's default is 4222)",
        False,
    ),
    (
        ("name or service not known", "nodename nor servname", "temporary failure in name resolution"),
        "unknown host name",
        "check the NATS host name's spelling and that this machine can resolve it",
        False,
    ),
    (
        ("timeout", "timed out"),
        "no answer in time",
        "check that the NATS server is reachable from here and the port is its client port (default 4222),"
        " not a broker's port",
        False,
    ),
)


class NatsErrors:
    """Errors of a NATS connection, collected by :meth:`record` (its ``error_cb``).

    nats-py's own connect failure only says "no servers available": the cause went to the
    callback, so the last one is kept. Each is logged at debug level (nats-py's default prints a
    traceback per failed attempt; callers get a typed error anyway)."""

    def __init__(self) -> None:
        self.last: BaseException | None = None

    async def record(self, exc: Exception) -> None:
        # A diagnosed cause is kept over a later undiagnosed one: a server refusing credentials
        # may reset the connection before nats-py reads its -ERR, so of several attempts some say
        # only "connection reset by peer".
        if self.last is None or _nats_cause(_text(exc)) is not None or _nats_cause(_text(self.last)) is None:
            self.last = exc
        log.debug("NATS: %s: %s", type(exc).__name__, exc)

    def connect_error(self, urls: Sequence[str], exc: BaseException) -> UnavailableError:
        """The typed error of a failed connect: the last cause seen, else ``exc``."""
        return nats_connect_error(urls, self.last if self.last is not None else exc)


def nats_connect_error(urls: Sequence[str], exc: BaseException) -> UnavailableError:
    """The error of a failed NATS connection: the cause nats-py gave, in words, and what to check.
    The URLs are redacted (no ``user:password@``)."""
    text = _text(exc)
    where = redact_urls(urls)
    known = _nats_cause(text)
    if known is not None:
        _, cause, check, _ = known
        return UnavailableError(f"cannot connect to NATS at {where}: {cause}; {check}", cause=text)
    return UnavailableError(
        f"cannot connect to NATS at {where} ({redact_urls([text])}); check 'NATS servers' (nats://host:port) and"
        " that NATS runs there",
        cause=text,
    )


def is_nats_refusal(error: BaseException) -> bool:
    """Whether a NATS connect error (:func:`nats_connect_error`) says the server was reached and
    refused this client (credentials, or TLS): a configuration error to report, which a fallback to
    gRPC would hide, unlike an unreachable server."""
    known = _nats_cause(getattr(error, "cause", ""))
    return known is not None and known[3]


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _nats_cause(text: str) -> tuple[tuple[str, ...], str, str, bool] | None:
    low = text.lower()
    return next((entry for entry in _NATS_CAUSES if any(n in low for n in entry[0])), None)


#: What a stock Liftbridge answers SetCursor/FetchCursor with when cursors are off (INTERNAL).
_CURSORS_DISABLED_TEXT = "cursors stream does not exist"


def is_cursors_disabled(details: str) -> bool:
    """Whether a cursor call's status text says the cluster has cursors switched off."""
    return _CURSORS_DISABLED_TEXT in details.lower()


def cursors_disabled_error(method: str, details: str) -> CursorsDisabledError:
    """The typed error of a cursor call on a cluster with cursors off."""
    return CursorsDisabledError(
        f'{method} failed: cursors are disabled on this Liftbridge cluster (server said: "{details}"). '
        "Enable them in every broker's configuration with cursors.stream.partitions: 1 (or more) and, on a"
        " cluster, cursors.stream.replication.factor (e.g. 3), then restart the brokers. Exactly-once"
        " publishing, the event trigger and cursor_id sensors need them."
    )
