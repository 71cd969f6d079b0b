"""``LiftbridgeAsyncHook``: the async client for triggers, with connections looked up the way the
triggerer allows (no database access: the async secrets lookup of the task SDK)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, ConnectionSettings

from ..connection_fields import CONN_TYPE, DEFAULT_CONN_ID
from .connection import settings_from_connection

__all__ = ["TRIGGERER_CLIENT_OPTIONS", "LiftbridgeAsyncHook"]

#: Client options for code running in the triggerer. Many waiting triggers share the process-wide
#: channel registry; with subscriptions on the unary channel too, that is exactly one channel per
#: broker. The grpc.aio reader keeps a thousand waiting subscriptions in the event loop, with no
#: thread each (the client's default reader starts one per subscription).
TRIGGERER_CLIENT_OPTIONS: dict[str, Any] = {"subscription_channels": 0, "subscription_reader": "aio"}


class LiftbridgeAsyncHook(BaseHook):
    """Build an :class:`AsyncLiftbridgeClient` from a ``liftbridge`` connection, inside an event loop.

    The connection is fetched with ``BaseHook.aget_connection`` (``Connection.async_get``), which
    does not block the loop: in the triggerer it tries the triggerer's environment variables, its
    secrets backend, then the metadata database (read for the trigger by the triggerer's main
    process; see docs/airflow.md, "Where triggers find their connection"). The client's gRPC
    channels come from the process-wide registry of the async client, so many triggers in one
    triggerer share one channel per broker.

    :param liftbridge_conn_id: the connection id (default ``liftbridge_default``).
    """

    conn_name_attr = "liftbridge_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Liftbridge (async)"

    def __init__(self, liftbridge_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.liftbridge_conn_id = liftbridge_conn_id
        self._settings: ConnectionSettings | None = None
        self._client: AsyncLiftbridgeClient | None = None

    async def get_settings(self) -> ConnectionSettings:
        """The connection's validated settings, fetched once.

        :raises LiftbridgeConnectionConfigError: a field of the connection is missing or invalid.
        :raises AirflowNotFoundException: no such connection.
        """
        if self._settings is None:
            conn = await self.aget_connection(self.liftbridge_conn_id)
            self._settings = settings_from_connection(conn)
        return self._settings

    async def get_async_client(self) -> AsyncLiftbridgeClient:
        """The async client of this connection, built on first call and reused until :meth:`aclose`."""
        if self._client is None:
            settings = await self.get_settings()
            self._client = AsyncLiftbridgeClient.from_settings(settings, **TRIGGERER_CLIENT_OPTIONS)
        return self._client

    async def aclose(self) -> None:
        """Close the client if one was built (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return await self.get_async_client()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
