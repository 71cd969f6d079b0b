"""``LiftbridgeHook``: the ``liftbridge`` connection type and the client built from it."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_liftbridge.client import ConnectionSettings, LiftbridgeClient, LiftbridgeError

from .connection import settings_from_connection
from .connection_fields import CONN_TYPE, DEFAULT_CONN_ID, UI_FIELD_BEHAVIOUR

__all__ = ["LiftbridgeHook"]

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
        return settings.client()

    def get_conn(self) -> LiftbridgeClient:
        """Return :attr:`client` (the name Airflow hooks traditionally use)."""
        return self.client

    def close(self) -> None:
        """Close the client if one was built; the next use of :attr:`client` builds a new one."""
        client = self.__dict__.pop("client", None)
        if client is not None:
            client.close()

    def test_connection(self) -> tuple[bool, str]:
        """Ask every configured broker for the cluster metadata (the UI's Test button).

        :return: ``(True, message)`` when at least one broker answered, with how many did and the
            cluster size they report; ``(False, message)`` otherwise. Never raises.
        """
        try:
            settings = self.settings
        except Exception as exc:  # the form's fields are at fault: say which
            return False, str(exc)
        answered: list[str] = []
        failed: list[str] = []
        cluster: set[str] = set()
        kwargs = settings.client_kwargs() | {"timeout": min(settings.timeout, _PROBE_TIMEOUT), "max_retries": 0}
        for broker in settings.brokers:
            try:
                with LiftbridgeClient(broker, **kwargs) as probe:
                    metadata = probe.fetch_metadata()
            except (LiftbridgeError, OSError) as exc:
                failed.append(f"{broker} ({exc})")
                continue
            answered.append(broker)
            cluster.update(b.id for b in metadata.brokers)
        total = len(settings.brokers)
        if not answered:
            return False, f"none of the {total} configured broker(s) answered: {'; '.join(failed)}"
        message = (
            f"{len(answered)} of {total} configured broker(s) answered; the cluster reports {len(cluster)} broker(s)"
        )
        if failed:
            message += f"; no answer from {'; '.join(failed)}"
        return True, message
