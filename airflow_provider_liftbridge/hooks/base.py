"""``LiftbridgeHook``: the ``liftbridge`` connection type and the client built from it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import re
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_liftbridge.client import (
    ConnectionSettings,
    CursorsDisabledError,
    LiftbridgeClient,
    LiftbridgeError,
    UnavailableError,
)
from airflow_provider_liftbridge.client.diagnostics import explain_unreachable, sniff_protocol
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.exceptions import LiftbridgeConnectionConfigError
from airflow_provider_liftbridge.nats_security import redact_url

from ..connection_fields import CONN_TYPE, DEFAULT_CONN_ID, UI_FIELD_BEHAVIOUR
from .connection import settings_from_connection

__all__ = ["LiftbridgeHook"]

#: gRPC's "ipv4:10.0.0.1:9292: " in front of a connection error.
_ADDRESS_PREFIX = re.compile(r"\b(?:ipv4|ipv6|unix):\S*?: ")

#: Per-broker probe of ``test_connection``: short, and no retries, so one dead broker shows as dead.
_PROBE_TIMEOUT = 5.0


class LiftbridgeHook(BaseHook):
    """Talk to a Liftbridge cluster described by an Airflow connection of type ``liftbridge``.

    The connection's ``host`` holds the brokers (``host``, ``host:port`` or a comma-separated list;
    ``port`` is the default port, 9292 when empty). Extras configure TLS, NATS servers, the default
    ack policy, timeouts and retries (see ``docs/airflow.md``).

    Operators and sensors use :attr:`client`; they never build clients themselves.

    :param liftbridge_conn_id: the connection id (default ``liftbridge_default``).
    :raises LiftbridgeConnectionConfigError: when the settings are first used, if a field of the
        connection is missing or invalid (the error names the field).
    """

    conn_name_attr = "liftbridge_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Liftbridge"

    def __init__(self, liftbridge_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.liftbridge_conn_id = liftbridge_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Field behaviour for Airflow versions that read it from the hook (3.2+ reads the
        declarative ``ui-field-behaviour`` of the provider metadata instead)."""
        return {
            "hidden_fields": list(UI_FIELD_BEHAVIOUR["hidden-fields"]),
            "relabeling": dict(UI_FIELD_BEHAVIOUR["relabeling"]),
            "placeholders": dict(UI_FIELD_BEHAVIOUR["placeholders"]),
        }

    @cached_property
    def settings(self) -> ConnectionSettings:
        """The connection's validated settings (read once per hook)."""
        return settings_from_connection(self.get_connection(self.liftbridge_conn_id))

    @cached_property
    def client(self) -> LiftbridgeClient:
        """The client of this connection, built on first use and reused until :meth:`close`."""
        settings = self.settings
        self.log.info("Connecting to Liftbridge brokers %s", ", ".join(settings.brokers))
        return LiftbridgeClient.from_settings(settings)

    def get_conn(self) -> LiftbridgeClient:
        """Return :attr:`client` (the name Airflow hooks traditionally use)."""
        return self.client

    def close(self) -> None:
        """Close the client if one was built; the next use of :attr:`client` builds a new one."""
        client = self.__dict__.pop("client", None)
        if client is not None:
            client.close()

    def test_connection(self) -> tuple[bool, str]:
        """Check the connection as the UI's Test button does; never raises.

        Asks every broker for the cluster metadata (naming, per broker that failed, gRPC's cause
        and what to check), says whether cursors are enabled, and connects to every NATS server.

        :return: ``(True, message)`` when at least one broker answered and every NATS server
            accepted the connection; ``(False, message)`` otherwise.
        """
        try:
            settings = self.settings
        except LiftbridgeConnectionConfigError as exc:  # the form's fields are at fault: say which
            return False, exc.form_message()
        except Exception as exc:
            return False, str(exc)
        return connection_report(settings)


def connection_report(settings: ConnectionSettings) -> tuple[bool, str]:
    """What :meth:`LiftbridgeHook.test_connection` reports for validated settings (see there)."""
    answered: list[str] = []
    failed: list[str] = []
    cluster: set[str] = set()
    cursors = ""
    probing = dataclasses.replace(
        settings, timeout=min(settings.timeout, _PROBE_TIMEOUT), max_retries=0, nats_servers=()
    )
    for broker in settings.brokers:
        try:
            with LiftbridgeClient.from_settings(dataclasses.replace(probing, brokers=(broker,))) as probe:
                metadata = probe.fetch_metadata()
                if not cursors:
                    cursors = _cursors_state(probe)
        except UnavailableError as exc:
            failed.append(f"{broker}: {_unreachable(broker, exc)}")
            continue
        except (LiftbridgeError, OSError) as exc:
            failed.append(f"{broker}: {exc}")
            continue
        answered.append(broker)
        cluster.update(b.id for b in metadata.brokers)
    total = len(settings.brokers)
    if answered:
        parts = [
            f"{len(answered)} of {total} configured broker(s) answered; the cluster reports {len(cluster)} broker(s)"
        ]
        if failed:
            parts.append(f"No answer from {'; '.join(failed)}")
        parts.append(cursors)
    else:
        parts = [f"none of the {total} configured broker(s) answered: {'; '.join(failed)}"]
    nats_ok, nats_report = _nats_report(settings)
    parts.append(nats_report)
    return bool(answered) and nats_ok, ". ".join(p for p in parts if p) + "."


def _unreachable(broker: str, exc: UnavailableError) -> str:
    """Why a broker did not answer, in words: gRPC's cause, made exact by looking at what the
    port says when gRPC only saw 'not HTTP/2' (a NATS port and a web server look alike to it)."""
    found = explain_unreachable(exc.cause)
    if found is None:  # an unknown cause: gRPC's last error, without the address named already
        said = _ADDRESS_PREFIX.sub("", exc.cause.rsplit("last error: ", 1)[-1]).strip()
        return f"no answer ({said}); check that a broker runs there" if said else str(exc)
    if "does not speak the liftbridge api" in found.cause.lower() or "http/1" in found.cause.lower():
        host, _, port = broker.rpartition(":")
        kind = sniff_protocol(host.strip("[]"), int(port))
        if kind == "nats":
            return "this is a NATS server, not a Liftbridge broker; put it in 'NATS servers' and give the broker's port"
        if kind == "http":
            return "an HTTP server answered, not a Liftbridge broker; give the broker's client port (default 9292)"
    return str(found)


def _cursors_state(client: LiftbridgeClient) -> str:
    """Whether the cluster has cursors enabled (exactly-once, the event trigger and cursor_id
    sensors need them): FetchCursor of a cursor nobody sets answers -1 when they are."""
    try:
        client.fetch_cursor("airflow-connection-test", "airflow-connection-test", 0)
    except CursorsDisabledError:
        return (
            "Cursors: disabled on this cluster; exactly-once publishing, the event trigger (AssetWatcher) and"
            " LiftbridgeMessageSensor(cursor_id=...) will fail until the brokers run with"
            " cursors.stream.partitions >= 1 (and cursors.stream.replication.factor on a cluster)"
        )
    except LiftbridgeError as exc:
        return f"Cursors: could not be checked ({exc})"
    return "Cursors: enabled"


def _run_coroutine(coro: Any) -> Any:
    """Run ``coro`` to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _nats_report(settings: ConnectionSettings) -> tuple[bool, str]:
    """Connect to each NATS server of the connection, with its TLS and credentials."""
    if not settings.nats_servers:
        return True, "NATS: none configured (bulk publishing uses gRPC; ack inboxes and NATS exactly-once are off)"

    async def probe(url: str) -> str:
        publisher = await NatsPublisher.connect(
            [url], connect_timeout=min(settings.timeout, _PROBE_TIMEOUT), security=settings.nats_security
        )
        await publisher.close()
        return "connected"

    results: list[str] = []
    ok = True
    for url in settings.nats_servers:
        try:
            _run_coroutine(probe(url))
            results.append(f"{redact_url(url)} connected")
        except LiftbridgeError as exc:
            ok = False
            results.append(str(exc))
    return ok, "NATS: " + "; ".join(results)
