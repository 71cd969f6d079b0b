"""The Liftbridge view's FastAPI app: a static page and JSON endpoints, mounted by Airflow's
api-server under :data:`~.plugin.URL_PREFIX` (see :mod:`.plugin`).

Security. Airflow does not protect a plugin's endpoints: every JSON endpoint here checks the user
with Airflow's own dependencies, as the core API's connection routes do
(``requires_access_connection("GET")`` reads ``{connection_id}`` from the path, so a user sees a
cluster only through a connection they may read). Reading messages (the browser, dead letters)
needs, on top of that, the custom view :data:`MESSAGES_RESOURCE` (``is_authorized_custom_view``),
so an auth manager can grant the cluster pages without the data. No response carries a field of
the connection (only its id), and error texts are scrubbed of its secrets.

Cost. The client is synchronous: every call runs in a worker thread (``run_in_threadpool``),
never on the api-server's event loop, with the connection's time-outs and retries.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_connection
from airflow.models.connection import Connection
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.utils.session import create_session
from fastapi import Depends, FastAPI, HTTPException, Query, status
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from airflow_provider_liftbridge.client import (
    CursorsDisabledError,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    RequestTimeoutError,
    UnavailableError,
)
from airflow_provider_liftbridge.connection_fields import CONN_TYPE
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeConnectionConfigError
from airflow_provider_liftbridge.hooks.connection import settings_from_connection

from . import charts, lag_api, model

__all__ = ["MESSAGES_RESOURCE", "app", "create_app"]

#: The custom view a user needs (``GET``) to read message contents.
MESSAGES_RESOURCE = "Liftbridge Messages"
STATIC = Path(__file__).resolve().parent / "static"

T = TypeVar("T")


# -- auth ----------------------------------------------------------------------------------------
#: Airflow's own connection-read check, as on the core API's ``/connections/{connection_id}``.
CONNECTION_READ = Depends(requires_access_connection("GET"))


async def _check_messages_read(user: GetUserDep) -> None:
    """The user may read message contents: the custom view :data:`MESSAGES_RESOURCE` (``GET``).

    :raises HTTPException: 403 when the auth manager says no.
    """
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=MESSAGES_RESOURCE, user=user):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"reading messages needs the '{MESSAGES_RESOURCE}' view (GET) in Airflow's auth manager",
        )


MESSAGES_READ = Depends(_check_messages_read)


# -- connections and clients ---------------------------------------------------------------------
_SECRET_WORDS = ("password", "token", "seed", "key", "creds", "secret")


def _secrets(conn: Any) -> list[str]:
    """Every value of the connection that must never appear in a response."""
    found = [conn.password or ""]
    for name, value in (conn.extra_dejson or {}).items():
        if any(word in name.lower() for word in _SECRET_WORDS) and isinstance(value, str):
            found.append(value)
    return [s for s in found if len(s) >= 3]


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _with_client(conn_id: str, work: Callable[[LiftbridgeClient], T]) -> T:
    """Build the connection's client, run ``work`` with it, close it (in a worker thread).

    :raises HTTPException: 404 no such connection, 400 not a ``liftbridge`` connection or a bad
        field, 4xx/5xx for what the cluster answered (scrubbed of the connection's secrets).
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no connection {conn_id!r}: create it, or pick one") from None
    secrets = _secrets(conn)
    if conn.conn_type != CONN_TYPE:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"connection {conn_id!r} is of type {conn.conn_type!r}: pick a liftbridge one"
        )
    try:
        settings = settings_from_connection(conn)
    except LiftbridgeConnectionConfigError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, _scrub(str(exc), secrets)) from None
    try:
        with LiftbridgeClient.from_settings(settings) as client:
            return work(client)
    except (LiftbridgeArgumentError, InvalidArgumentError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, _scrub(str(exc), secrets)) from None
    except (NoSuchStreamError, NoSuchPartitionError) as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, _scrub(str(exc), secrets)) from None
    except PartitionPausedError as exc:
        raise HTTPException(
            status.HTTP_409_CONFLICT, _scrub(f"{exc} (the view reads only; it does not resume a partition)", secrets)
        ) from None
    except CursorsDisabledError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, _scrub(str(exc), secrets)) from None
    except RequestTimeoutError as exc:
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, _scrub(str(exc), secrets)) from None
    except (UnavailableError, LiftbridgeError) as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, _scrub(str(exc), secrets)) from None


async def _off_loop(conn_id: str, work: Callable[[LiftbridgeClient], T]) -> T:
    return await run_in_threadpool(_with_client, conn_id, work)


def _liftbridge_connections(readable: set[str] | None) -> list[str]:
    """The ids of the metastore's ``liftbridge`` connections the user may read."""
    with create_session() as session:
        ids = session.scalars(select(Connection.conn_id).where(Connection.conn_type == CONN_TYPE)).all()
    return sorted(i for i in ids if readable is None or i in readable)


# -- the app -------------------------------------------------------------------------------------
def create_app() -> FastAPI:
    """The view's FastAPI app (routes under ``/api``, the page at ``/``)."""
    api = FastAPI(title="Liftbridge view", description="Streams, pipelines, dead letters and messages of a cluster.")
    connection_read, messages_read = CONNECTION_READ, MESSAGES_READ

    @api.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        """The page (static: it holds no data; the data comes from the checked endpoints)."""
        return FileResponse(STATIC / "index.html", media_type="text/html")

    # The page's script, style and the vendored chart library (no data; never from a CDN).
    api.mount("/static", StaticFiles(directory=STATIC), name="static")

    @api.get("/api/connections")
    async def connections(user: GetUserDep) -> dict[str, Any]:
        """The ``liftbridge`` connections (of the metastore) the user may read."""
        readable = get_auth_manager().get_authorized_connections(user=user, method="GET")
        return {"connections": await run_in_threadpool(_liftbridge_connections, set(readable))}

    @api.get("/api/connections/{connection_id}/cluster", dependencies=[connection_read])
    async def cluster(connection_id: str) -> dict[str, Any]:
        """Brokers and streams with their partitions."""
        return {"connection_id": connection_id} | await _off_loop(connection_id, model.cluster)

    @api.get("/api/connections/{connection_id}/pipelines", dependencies=[connection_read])
    async def pipelines(connection_id: str) -> dict[str, Any]:
        """The reading tasks and consumer groups, with per-partition lag and plans."""
        return {"connection_id": connection_id} | await _off_loop(connection_id, model.pipelines)

    @api.get("/api/connections/{connection_id}/history", dependencies=[connection_read])
    async def history(
        connection_id: str,
        runs: Annotated[int, Query(ge=1, le=charts.MAX_RUNS, description="runs per pipeline")] = charts.MAX_RUNS,
    ) -> dict[str, Any]:
        """Per pipeline and partition, lag and messages read per run; per stream, the message rate."""
        return {"connection_id": connection_id} | await _off_loop(connection_id, lambda c: charts.history(c, runs=runs))

    @api.get("/api/connections/{connection_id}/dead-letters", dependencies=[connection_read, messages_read])
    async def dead_letters(
        connection_id: str,
        stream: Annotated[list[str] | None, Query(description="dead-letter streams (default: the pipelines')")] = None,
        limit: Annotated[int, Query(ge=1, le=model.MAX_MESSAGES)] = 20,
    ) -> dict[str, Any]:
        """Per dead-letter stream: the count and the newest letters."""

        def work(client: LiftbridgeClient) -> dict[str, Any]:
            streams = stream or model.dead_letter_streams(client)
            return model.dead_letters(client, streams, limit=limit)

        return {"connection_id": connection_id} | await _off_loop(connection_id, work)

    @api.get(
        "/api/connections/{connection_id}/streams/{stream}/partitions/{partition}/messages",
        dependencies=[connection_read, messages_read],
    )
    async def messages(
        connection_id: str,
        stream: str,
        partition: int,
        last: Annotated[int | None, Query(ge=1, le=model.MAX_MESSAGES)] = None,
        from_offset: Annotated[int | None, Query(ge=0)] = None,
        from_time: Annotated[dt.datetime | None, Query(description="ISO 8601; UTC when it names no zone")] = None,
        limit: Annotated[int, Query(ge=1, le=model.MAX_MESSAGES)] = 20,
    ) -> dict[str, Any]:
        """The last N messages of a partition, or up to ``limit`` from an offset or a time."""

        def work(client: LiftbridgeClient) -> dict[str, Any]:
            return model.browse(
                client, stream, partition, last=last, from_offset=from_offset, from_time=from_time, limit=limit
            )

        return {"connection_id": connection_id} | await _off_loop(connection_id, work)

    lag_api.add_routes(api, _off_loop, [connection_read])  # /lag and /groups (ui/lag_api.py)
    return api


app = create_app()
