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

import base64
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_connection
from airflow.models.connection import Connection
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.utils.session import create_session
from fastapi import Depends, FastAPI, HTTPException, Query, status
from fastapi.responses import FileResponse, Response, StreamingResponse
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

from . import actions, actions_api, charts, lag_api, messages, model, streams, verdicts
from .search_input import SearchInputError, parse_count, parse_offset, parse_time

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


def _connection_settings(conn_id: str) -> tuple[Any, list[str]]:
    """The connection's client settings and its secrets (to scrub from answers).

    :raises HTTPException: 404 no such connection, 400 not a ``liftbridge`` connection or a bad field.
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
        return settings_from_connection(conn), secrets
    except LiftbridgeConnectionConfigError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, _scrub(str(exc), secrets)) from None


#: What the client raises, as an answer (the first class that matches).
_ANSWERS: list[tuple[tuple[type[Exception], ...], int, str]] = [
    ((LiftbridgeArgumentError, InvalidArgumentError), status.HTTP_400_BAD_REQUEST, ""),
    ((NoSuchStreamError, NoSuchPartitionError), status.HTTP_404_NOT_FOUND, ""),
    ((actions.PausedLettersError,), status.HTTP_409_CONFLICT, ""),  # a replay: says what to do
    ((PartitionPausedError,), status.HTTP_409_CONFLICT, " (the view reads only; it does not resume a partition)"),
    ((CursorsDisabledError,), status.HTTP_409_CONFLICT, ""),
    ((RequestTimeoutError,), status.HTTP_504_GATEWAY_TIMEOUT, ""),
    ((UnavailableError, LiftbridgeError), status.HTTP_502_BAD_GATEWAY, ""),
]


def _answer(exc: Exception, secrets: list[str]) -> HTTPException | None:
    """The answer for what the client (or a check of the browser's input) raised; ``None``: not ours."""
    if isinstance(exc, SearchInputError):  # the browser marks the field named
        return HTTPException(status.HTTP_400_BAD_REQUEST, {"field": exc.field, "message": _scrub(str(exc), secrets)})
    for kinds, code, note in _ANSWERS:
        if isinstance(exc, kinds):
            return HTTPException(code, _scrub(f"{exc}{note}", secrets))
    return None


def _with_client(conn_id: str, work: Callable[[LiftbridgeClient], T]) -> T:
    """Build the connection's client, run ``work`` with it, close it (in a worker thread).

    :raises HTTPException: 404 no such connection, 400 not a ``liftbridge`` connection or a bad
        field, 4xx/5xx for what the cluster answered (scrubbed of the connection's secrets).
    """
    settings, secrets = _connection_settings(conn_id)
    try:
        with LiftbridgeClient.from_settings(settings) as client:
            return work(client)
    except (SearchInputError, LiftbridgeArgumentError, LiftbridgeError) as exc:
        raise (_answer(exc, secrets) or exc) from None


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
    # No /docs, /redoc or /openapi.json: they would be served to anyone (a plugin's app gets no
    # auth of Airflow's), and the routes are the page's, not an API promised to others.
    api = FastAPI(
        title="Liftbridge view",
        description="Streams, pipelines, dead letters and messages of a cluster.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
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

    @api.get("/api/connections/{connection_id}/streams", dependencies=[connection_read])
    async def stream_list(
        connection_id: str,
        sort: Annotated[str | None, Query(description=f"one of {', '.join(streams.SORTS)}")] = None,
        order: Annotated[str | None, Query(description="asc (default) or desc")] = None,
        offset: Annotated[str | None, Query(description="streams to skip (paging)")] = None,
        limit: Annotated[str | None, Query(description=f"streams per page, 1 to {streams.MAX_PAGE}")] = None,
        filter: Annotated[str | None, Query(description="name or subject contains (any case)")] = None,
    ) -> dict[str, Any]:
        """One page of the streams, sorted: sizes, partitions, oldest and newest offsets, times. A
        bad field is a 400 naming it."""

        def work(client: LiftbridgeClient) -> dict[str, Any]:
            if (sort or "name") not in streams.SORTS:
                raise SearchInputError("sort", f"sort must be one of {', '.join(streams.SORTS)}; got {sort!r}")
            if (order or "asc") not in ("asc", "desc"):
                raise SearchInputError("order", f"order must be asc or desc; got {order!r}")
            return streams.page(
                client,
                sort=sort or "name",
                descending=order == "desc",
                offset=parse_offset(offset, "offset") or 0,
                limit=parse_count(limit, "limit", streams.DEFAULT_PAGE, streams.MAX_PAGE) or streams.DEFAULT_PAGE,
                text=filter,
            )

        return {"connection_id": connection_id} | await _off_loop(connection_id, work)

    @api.get("/api/connections/{connection_id}/pipelines", dependencies=[connection_read])
    async def pipelines(connection_id: str) -> dict[str, Any]:
        """The reading tasks and consumer groups, with per-partition lag, plans and verdicts (as the
        Lag tab's, with the thresholds of :data:`.lag_api.THRESHOLDS_VARIABLE`)."""
        limits, error = await run_in_threadpool(lag_api.read_thresholds)
        body = await _off_loop(connection_id, lambda c: verdicts.judge_pipelines(c, limits))
        return {"connection_id": connection_id, "thresholds_error": error} | body

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
        partition: str,
        last: str | None = None,
        from_offset: str | None = None,
        from_time: Annotated[str | None, Query(description="ISO 8601; UTC when it names no zone")] = None,
        limit: str | None = None,
    ) -> dict[str, Any]:
        """The last N messages of a partition, or up to ``limit`` from an offset or a time. A field
        that is not what it should be (the partition too: typed, not parsed by FastAPI) is a 400
        naming it, as the browser's routes answer."""

        def work(client: LiftbridgeClient) -> dict[str, Any]:
            return model.browse(
                client,
                stream,
                _partition_number(partition),
                last=parse_count(last, "last", None, model.MAX_MESSAGES),
                from_offset=parse_offset(from_offset, "from_offset"),
                from_time=parse_time(from_time, "from_time"),
                limit=parse_count(limit, "limit", 20, model.MAX_MESSAGES) or 20,
            )

        return {"connection_id": connection_id} | await _off_loop(connection_id, work)

    _browser_routes(api, [connection_read, messages_read])
    lag_api.add_routes(api, _off_loop, [connection_read])  # /lag and /groups (ui/lag_api.py)
    actions_api.add_routes(api, _off_loop, [connection_read, messages_read])  # replay, cursor (ui/actions_api.py)
    return api


def _partition_number(text: str) -> int:
    """A partition number from the path, or a 400 naming the field (never FastAPI's raw 422)."""
    number = parse_offset(text, "partition")
    if number is None:
        raise SearchInputError("partition", "partition must be a whole number, 0 or more (e.g. 0); got ''")
    return number


# -- the message browser (docs/ui.md, "The message browser") ------------------------------------
def _browser_routes(api: FastAPI, checks: list[Any]) -> None:
    """The browser's search (streamed as NDJSON), one message, and one message's value."""
    base = "/api/connections/{connection_id}/streams/{stream}"

    @api.get(f"{base}/search", dependencies=checks)
    async def search(
        connection_id: str,
        stream: str,
        partition: Annotated[str | None, Query(description="a partition, or 'all' (merged by time)")] = None,
        order: Annotated[str | None, Query(description="newest (default) or oldest first")] = None,
        offset: str | None = None,
        time: Annotated[str | None, Query(description="ISO 8601; UTC when it names no zone")] = None,
        at: Annotated[str | None, Query(description="a page position: partition:offset,...")] = None,
        scan: Annotated[str | None, Query(description="forward or backward (paging)")] = None,
        key: str | None = None,
        value: str | None = None,
        path: Annotated[str | None, Query(description="JSON path: $.a.b[0] [== value | != value]")] = None,
        header: Annotated[str | None, Query(description="name, or name=value")] = None,
        limit: str | None = None,
        max_bytes: str | None = None,
    ) -> StreamingResponse:
        """Find messages; the answer is NDJSON, one event a line (``start``, ``message``,
        ``progress``, ``end``, or ``error`` when a read fails midway), see :class:`.messages.Search`."""
        fields = {"partition": partition, "order": order, "offset": offset, "at_time": time, "at": at}
        fields |= {"scan": scan, "key": key, "value": value, "path": path, "header": header}
        fields |= {"limit": limit, "max_bytes": max_bytes}
        settings, secrets = await run_in_threadpool(_connection_settings, connection_id)
        client = await run_in_threadpool(LiftbridgeClient.from_settings, settings)
        try:
            planned = await run_in_threadpool(lambda: messages.plan(client, stream, **fields))
        except BaseException as exc:
            await run_in_threadpool(client.close)
            answer = _answer(exc, secrets) if isinstance(exc, Exception) else None
            if answer is None:
                raise
            raise answer from None
        return StreamingResponse(
            _ndjson(client, planned.events(), secrets),
            media_type="application/x-ndjson",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @api.get(f"{base}/partitions/{{partition}}/messages/{{offset}}", dependencies=checks)
    async def message(connection_id: str, stream: str, partition: str, offset: str) -> dict[str, Any]:
        """One message: its subject and reply subject, the publisher's headers, and its key and
        value as base64 (the value up to :data:`.messages.MAX_VIEW_BYTES`)."""
        found = await _off_loop(connection_id, lambda c: messages.message_at(c, stream, partition, offset))
        shown = found.value[: messages.MAX_VIEW_BYTES]
        return {
            "connection_id": connection_id,
            "message": model.render_message(found),
            "subject": found.subject,
            "reply_subject": found.reply_subject,
            "key_b64": base64.b64encode(found.key).decode() if found.key is not None else None,
            "value_b64": base64.b64encode(shown).decode(),
            "value_size": len(found.value),
            "value_cut": len(shown) < len(found.value),
        }

    @api.get(f"{base}/partitions/{{partition}}/messages/{{offset}}/value", dependencies=checks)
    async def message_value(connection_id: str, stream: str, partition: str, offset: str) -> Response:
        """One message's value, whole, as a file to download."""
        found = await _off_loop(connection_id, lambda c: messages.message_at(c, stream, partition, offset))
        name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{stream}-{found.partition}-{found.offset}")
        return Response(
            found.value,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{name}.bin"', "Cache-Control": "no-store"},
        )


async def _ndjson(client: LiftbridgeClient, events: Iterator[dict[str, Any]], secrets: list[str]) -> AsyncIterator[str]:
    """The search's events as NDJSON lines, each read in a worker thread; a failed read becomes an
    ``error`` event. Closes the search and the client at the end, and when the browser goes away
    (its Stop button: Starlette then cancels this generator)."""
    try:
        while (event := await run_in_threadpool(next, events, None)) is not None:
            yield json.dumps(event) + "\n"
    except (LiftbridgeError, LiftbridgeArgumentError) as exc:
        answer = _answer(exc, secrets)
        assert answer is not None
        yield json.dumps({"type": "error", "status": answer.status_code, "detail": answer.detail}) + "\n"
    finally:
        with anyio.CancelScope(shield=True):  # cancelled (the browser left): still close
            await run_in_threadpool(_close_search, events, client)


def _close_search(events: Iterator[dict[str, Any]], client: LiftbridgeClient) -> None:
    try:
        events.close()  # type: ignore[attr-defined]  # a generator: ends its subscription
    finally:
        client.close()


app = create_app()
