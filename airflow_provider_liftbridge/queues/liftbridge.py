"""``LiftbridgeMessageQueueProvider``: lets ``MessageQueueTrigger`` of the common.messaging provider
watch a Liftbridge stream with :class:`~airflow_provider_liftbridge.triggers.event.LiftbridgeEventTrigger`.

Two ways to name the stream, as the common.messaging provider offers them:

* ``MessageQueueTrigger(scheme="liftbridge", stream="orders", partition=0, ...)``: the keyword
  arguments are the trigger's.
* ``MessageQueueTrigger(queue="liftbridge://HOST:PORT[,HOST:PORT]/STREAM?partition=N&...")``
  (deprecated by common.messaging, still supported): the URI gives the brokers, the stream and,
  as query parameters, ``partition``, ``start_at``, ``cursor_id``, ``poll_interval`` and
  ``conn_id``. With no host (``liftbridge:///STREAM``) the connection is used.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from airflow.exceptions import AirflowOptionalProviderFeatureException

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # ProvidersManager logs this as an optional feature, not an error
    raise AirflowOptionalProviderFeatureException(
        "the Liftbridge queue provider needs apache-airflow-providers-common-messaging"
    ) from exc

__all__ = ["LiftbridgeMessageQueueProvider", "LiftbridgeQueueUriError", "parse_queue_uri", "SCHEME"]

SCHEME = "liftbridge"
_BROKER = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")
#: URI query parameter -> trigger argument.
_QUERY_ARGS = {
    "partition": "partition",
    "start_at": "start_at",
    "cursor_id": "cursor_id",
    "poll_interval": "poll_interval",
    "conn_id": "liftbridge_conn_id",
}
_FORM = f"{SCHEME}://HOST:PORT[,HOST:PORT]/STREAM[?partition=N&start_at=...&cursor_id=...&conn_id=...]"


class LiftbridgeQueueUriError(LiftbridgeArgumentError):
    """A ``liftbridge://`` queue URI is malformed (the message says which part and shows the form)."""

    def __init__(self, uri: str, problem: str) -> None:
        self.uri = uri
        super().__init__(f"queue URI {uri!r}: {problem}; expected {_FORM}")


def _brokers(uri: str, netloc: str) -> str | None:
    if not netloc:
        return None
    if "@" in netloc:
        raise LiftbridgeQueueUriError(uri, "credentials are not accepted in the URI; put TLS settings in a connection")
    for broker in netloc.split(","):
        match = _BROKER.match(broker)
        if match is None or not 0 < int(match.group(2)) < 65536:
            raise LiftbridgeQueueUriError(uri, f"broker {broker!r} is not HOST:PORT with a port from 1 to 65535")
    return netloc


def parse_queue_uri(uri: str) -> dict[str, Any]:
    """The :class:`LiftbridgeEventTrigger` arguments a ``liftbridge://`` URI gives.

    :raises LiftbridgeQueueUriError: wrong scheme, bad broker, no or several path segments,
        an unknown or repeated query parameter, or a partition that is not a number.
    """
    if not isinstance(uri, str):
        raise LiftbridgeQueueUriError(str(uri), "not a string")
    parts = urlsplit(uri.strip())
    if parts.scheme.lower() != SCHEME:
        raise LiftbridgeQueueUriError(uri, f"the scheme must be {SCHEME!r}")
    if parts.fragment:
        raise LiftbridgeQueueUriError(uri, "a '#fragment' means nothing here")
    kwargs: dict[str, Any] = {}
    brokers = _brokers(uri, parts.netloc)
    if brokers is not None:
        kwargs["brokers"] = brokers
    path = parts.path.strip("/")
    if not path:
        raise LiftbridgeQueueUriError(uri, "the stream name is missing (the path)")
    if "/" in path:
        raise LiftbridgeQueueUriError(uri, f"the path {parts.path!r} must be one stream name")
    kwargs["stream"] = unquote(path)
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise LiftbridgeQueueUriError(uri, f"the query {parts.query!r} is not name=value&...") from None
    for name, values in query.items():
        if name not in _QUERY_ARGS:
            raise LiftbridgeQueueUriError(uri, f"unknown parameter {name!r} (known: {', '.join(_QUERY_ARGS)})")
        if len(values) != 1 or not values[0]:
            raise LiftbridgeQueueUriError(uri, f"parameter {name!r} must be given once, with a value")
        kwargs[_QUERY_ARGS[name]] = values[0]
    if "partition" in kwargs:
        if not kwargs["partition"].isdigit():
            raise LiftbridgeQueueUriError(uri, f"partition {kwargs['partition']!r} is not a partition number")
        kwargs["partition"] = int(kwargs["partition"])
    if "poll_interval" in kwargs:
        try:
            kwargs["poll_interval"] = float(kwargs["poll_interval"])
        except ValueError:
            raise LiftbridgeQueueUriError(uri, f"poll_interval {kwargs['poll_interval']!r} is not a number") from None
    return kwargs


class LiftbridgeMessageQueueProvider(BaseMessageQueueProvider):  # type: ignore[misc]
    """Resolves ``scheme="liftbridge"`` and ``liftbridge://`` queue URIs to
    :class:`~airflow_provider_liftbridge.triggers.event.LiftbridgeEventTrigger`."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        """Whether ``queue`` is a ``liftbridge://`` URI (any letter case of the scheme)."""
        return isinstance(queue, str) and queue.strip().lower().startswith(f"{SCHEME}://")

    def trigger_class(self) -> type[LiftbridgeEventTrigger]:
        return LiftbridgeEventTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """The trigger arguments the URI gives, minus those also given as keyword arguments
        (``MessageQueueTrigger`` passes both to the trigger).

        :raises LiftbridgeQueueUriError: the URI is malformed, or says something else than a
            keyword argument given with it.
        """
        from_uri = parse_queue_uri(queue)
        for name in set(from_uri) & set(kwargs):
            if from_uri[name] != kwargs[name]:
                raise LiftbridgeQueueUriError(
                    queue, f"{name}={from_uri[name]!r} in the URI contradicts the keyword argument {kwargs[name]!r}"
                )
            del from_uri[name]
        return from_uri
