"""How the client proves itself to NATS and checks NATS: TLS and authentication, in one value.

:class:`NatsSecurity` is the one settings type of every NATS connection the provider opens (bulk
publishing, ack inboxes, exactly-once over NATS, Spark executors, triggers); :meth:`NatsSecurity.
connect_options` turns it into nats-py ``connect()`` keyword arguments. It holds file paths and
short strings only, so it pickles (Spark ships it to executors) and compares by value. Neutral
ground (imports nothing of the project): the client, the Airflow layer and the dev server share it.

Secrets (password, token) never appear in its ``repr``; :func:`redact_url` hides the
``user:password@`` part of a NATS URL wherever one is printed.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from .extras import MissingExtraError, needs_extra

__all__ = ["NATS_SCHEMES", "NatsSecurity", "NatsSecurityError", "check_nats_url", "redact_url", "redact_urls"]


class NatsSecurityError(ValueError):
    """NATS security settings that cannot work (the message names the field and what to do)."""


_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^@/\s,]*)@")


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` (or ``token@``) part replaced by ``***@``; every URL in a
    comma-separated list is redacted."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", url)


def redact_urls(urls: Iterable[str]) -> str:
    """The URLs, redacted, joined with ", " (for messages and logs)."""
    return ", ".join(redact_url(u) for u in urls)


#: URL schemes nats-py connects with.
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def check_nats_url(entry: str) -> str:
    """A NATS server URL, ``scheme://[user[:password]@]host[:port]``; a bare ``host[:port]`` means
    ``nats://host[:port]``. Returns the URL with its scheme.

    :raises ValueError: another scheme, or no usable host and port (``"nats//x"`` reads as no
        URL at all: its host would be ``nats//x``).
    """
    text = str(entry).strip()
    url = text if "://" in text else f"nats://{text}"
    scheme, _, rest = url.partition("://")
    if scheme not in NATS_SCHEMES:
        raise ValueError(f"{redact_url(text)!r} has scheme {scheme!r}; use nats://host:port (or tls://, ws://, wss://)")
    where = rest.rsplit("@", 1)[-1].rstrip("/")
    if where.startswith("["):
        host, _, port = where.partition("]")
        host, port = host + "]", port.removeprefix(":")
    else:
        host, _, port = where.partition(":")
    if not _HOST.fullmatch(host) or (port and (not port.isdigit() or not 0 < int(port) < 65536)):
        raise ValueError(f"{redact_url(text)!r} is not a NATS URL; use nats://host:port, e.g. nats://127.0.0.1:4222")
    return url


@dataclass(frozen=True)
class NatsSecurity:
    """TLS and authentication of NATS connections (all optional; nothing set: plain, anonymous).

    Authentication takes one form: ``user`` with ``password``, or ``token``, or ``nkey_seed_file``,
    or ``credentials_file`` (a ``.creds`` file: a user JWT and its NKEY seed).

    :param tls: use TLS even without any TLS file (the system's CA roots check the server).
        On by itself when a TLS file or ``tls_server_name`` is set, and for ``tls://`` URLs.
    :param tls_ca_file: PEM file of the CA that signed the NATS server's certificate.
    :param tls_cert_file: PEM client certificate (mutual TLS); needs ``tls_key_file``.
    :param tls_key_file: PEM private key of the client certificate.
    :param tls_server_name: name to check the server certificate against, when it differs from the
        host in the URL.
    :param user: user name (with ``password``).
    :param password: password of ``user``.
    :param token: authentication token.
    :param nkey_seed_file: file holding an NKEY user seed (``SU...``); needs the ``nkeys`` package
        (``pip install airflow-provider-liftbridge[nats-nkeys]``).
    :param credentials_file: a NATS ``.creds`` file (user JWT and seed); needs ``nkeys`` too.
    :raises NatsSecurityError: (on construction) two forms of authentication, a password
        without a user (or the reverse), a certificate without its key (or the reverse); the
        message names the field.
    """

    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed_file: str | None = None
    credentials_file: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            missing = "tls_key_file" if self.tls_key_file is None else "tls_cert_file"
            raise NatsSecurityError(f"NatsSecurity.{missing} is missing: mutual TLS needs the certificate and its key")
        if (self.user is None) != (self.password is None):
            missing = "password" if self.password is None else "user"
            raise NatsSecurityError(f"NatsSecurity.{missing} is missing: user and password go together")
        forms = [
            name
            for name, value in (
                ("user/password", self.user),
                ("token", self.token),
                ("nkey_seed_file", self.nkey_seed_file),
                ("credentials_file", self.credentials_file),
            )
            if value
        ]
        if len(forms) > 1:
            raise NatsSecurityError(
                f"NatsSecurity has {' and '.join(forms)}: NATS takes one form of authentication; keep one"
            )

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value in (None, False):
                continue
            shown.append(f"{f.name}='***'" if f.name in ("password", "token") else f"{f.name}={value!r}")
        return f"NatsSecurity({', '.join(shown)})"

    @property
    def uses_tls(self) -> bool:
        """Whether connections use TLS (set explicitly, or implied by a TLS file or server name)."""
        return bool(self.tls or self.tls_ca_file or self.tls_cert_file or self.tls_server_name)

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context (the CA file, or the system roots; the client certificate if set).

        :raises NatsSecurityError: a file cannot be read or is not PEM (the message names it).
        """
        try:
            context = ssl.create_default_context(cafile=_expand(self.tls_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise NatsSecurityError(
                f"NATS TLS CA file {self.tls_ca_file!r} cannot be used ({exc}); check the path and that it is PEM"
            ) from exc
        if self.tls_cert_file and self.tls_key_file:
            try:
                context.load_cert_chain(_expand(self.tls_cert_file) or "", _expand(self.tls_key_file))
            except (OSError, ssl.SSLError) as exc:
                raise NatsSecurityError(
                    f"NATS TLS client certificate {self.tls_cert_file!r} / key {self.tls_key_file!r} cannot be used"
                    f" ({exc}); check the paths and that the key matches the certificate"
                ) from exc
        return context

    def connect_options(self, servers: Iterable[str] = ()) -> dict[str, Any]:
        """nats-py ``connect()`` keyword arguments for these settings (none when nothing is set).

        ``servers``: the URLs to be connected to; a ``tls://`` URL switches TLS on.

        :raises NatsSecurityError: an unreadable TLS file, or an NKEY / credentials file without
            the ``nkeys`` package (the message says what to install).
        """
        options: dict[str, Any] = {}
        if self.uses_tls or any(str(u).startswith("tls://") for u in servers):
            options["tls"] = self.ssl_context()
            if self.tls_server_name:
                options["tls_hostname"] = self.tls_server_name
        if self.user is not None:
            options["user"], options["password"] = self.user, self.password
        if self.token:
            options["token"] = self.token
        if self.nkey_seed_file or self.credentials_file:
            _require_nkeys()
            for what, path in (("nkey_seed_file", self.nkey_seed_file), ("credentials_file", self.credentials_file)):
                if path and not os.access(_expand(path) or "", os.R_OK):
                    raise NatsSecurityError(f"NatsSecurity.{what} {path!r} cannot be read; check the path")
            if self.nkey_seed_file:
                options["nkeys_seed"] = _expand(self.nkey_seed_file)
            if self.credentials_file:
                options["user_credentials"] = _expand(self.credentials_file)
        return options


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


def _require_nkeys() -> None:
    try:
        with needs_extra("nats-nkeys", "using NKEY seeds or .creds files"):
            import nkeys  # type: ignore[import-untyped]  # noqa: F401
    except MissingExtraError as exc:
        raise NatsSecurityError(str(exc)) from None
