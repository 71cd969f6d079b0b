"""The view's action endpoints (replay dead letters, move a cursor), added to its app by
:func:`add_routes` (called by :func:`.api.create_app`, which owns reading the connection and the
client's worker thread). The work is in :mod:`.actions`.

Who may act. An action changes the cluster through the connection, so it needs what the core
API's ``PATCH /connections/{connection_id}`` needs, edit rights on that connection
(``requires_access_connection("PUT")``), and on top the custom view :data:`ACTIONS_RESOURCE`
with ``POST`` (``is_authorized_custom_view``), which an auth manager that tells methods apart
(FAB, Keycloak) can withhold from a connection editor. The custom view alone would not do: the
simple auth manager grants every custom view to every role whatever the method. Moving a
pipeline's cursor also needs edit rights on its DAG (``is_authorized_dag(method="PUT")``, what
pausing or clearing it needs). :func:`permissions` answers the same questions without a 403, for
the page to show or hide its buttons.

Every action that passed those checks is written to Airflow's audit log (the ``Log`` table that
Browse → Audit Log shows), after it ran, with who, what, the stream and the counts or the refusal.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from airflow_provider_liftbridge.client import LiftbridgeClient

from . import actions
from .search_input import SearchInputError

__all__ = ["ACTIONS_RESOURCE", "add_routes", "permissions"]

#: The custom view a user needs (``POST``) to act (besides editing the connection).
ACTIONS_RESOURCE = "Liftbridge Actions"
#: Task-instance states in which a task may be reading: its commits would undo a cursor move.
_BUSY_STATES = ("queued", "scheduled", "running", "restarting", "deferred")

OffLoop = Callable[[str, Callable[[LiftbridgeClient], Any]], Awaitable[Any]]


def permissions(user: Any, connection_id: str) -> dict[str, Any]:
    """Whether ``user`` may act on the connection (edit it, and the :data:`ACTIONS_RESOURCE` view)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    manager = get_auth_manager()
    edit = manager.is_authorized_connection(method="PUT", details=ConnectionDetails(conn_id=connection_id), user=user)
    view = manager.is_authorized_custom_view(method="POST", resource_name=ACTIONS_RESOURCE, user=user)
    return {"allowed": bool(edit and view), "needs": f"edit the connection and the '{ACTIONS_RESOURCE}' view (POST)"}


def _check_actions(user: Any, connection_id: str) -> None:
    """:raises HTTPException: 403 when the user may not act (the text says what is needed)."""
    if not permissions(user, connection_id)["allowed"]:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"actions need edit rights on connection {connection_id!r} and the '{ACTIONS_RESOURCE}' view (POST)",
        )


def _check_dag_edit(user: Any, dag_id: str) -> None:
    """:raises HTTPException: 403 when the user may not edit the DAG."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    if not get_auth_manager().is_authorized_dag(method="PUT", details=DagDetails(id=dag_id), user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"moving a cursor of DAG {dag_id!r} needs edit rights on it")


def _busy_run(dag_id: str, task_id: str) -> str | None:
    """The run in which the task is queued or running, if any (from Airflow's metastore)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(TaskInstance.run_id).where(
            TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id, TaskInstance.state.in_(_BUSY_STATES)
        )
        return session.scalars(query.limit(1)).first()


def audit(user: Any, event: str, extra: dict[str, Any], dag_id: str | None = None, task_id: str | None = None) -> None:
    """One row of Airflow's audit log (the ``Log`` table), as Airflow's own API writes them."""
    from airflow.models import Log
    from airflow.utils.session import create_session

    name = user.get_name() if user else "anonymous"
    with create_session() as session:
        session.add(
            Log(
                event=event,
                owner=name,
                owner_display_name=name,
                extra=json.dumps(extra),
                dag_id=dag_id,
                task_id=task_id,
            )
        )


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object.

    :raises HTTPException: 400 when it is not one (saying what to send).
    """
    if "application/json" not in request.headers.get("content-type", ""):
        # Only a script of the page sends JSON: a form of another site cannot (no CORS preflight passes).
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send the body as JSON (Content-Type: application/json)"
        )
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, 'send a JSON object, e.g. {"offset": "1200"}')
    return body


def _detail(exc: HTTPException) -> str:
    detail = exc.detail
    return detail.get("message", str(detail)) if isinstance(detail, dict) else str(detail)


def add_routes(api: FastAPI, off_loop: OffLoop, reading: list[Any]) -> None:
    """The action endpoints. ``reading``: the dependencies of reading the connection and the
    messages (401 without a login, 403 for a bad token or a user who may not read them)."""
    base = "/api/connections/{connection_id}"

    @api.get(f"{base}/actions", dependencies=reading[:1])
    async def action_permissions(connection_id: str, user: GetUserDep) -> dict[str, Any]:
        """Whether the user may act on this connection (the page shows its buttons only then)."""
        return {"connection_id": connection_id} | await run_in_threadpool(permissions, user, connection_id)

    @api.post(f"{base}/dead-letters/{{stream}}/replay-plan", dependencies=reading)
    async def replay_plan(connection_id: str, stream: str, request: Request, user: GetUserDep) -> dict[str, Any]:
        """What a replay would put back where (the dialog's numbers); ``{}`` means all letters,
        and the answer pins them (``through``). Changes nothing."""
        await run_in_threadpool(_check_actions, user, connection_id)
        letters = (await _body(request)).get("letters")
        plan = await off_loop(connection_id, lambda c: actions.plan_replay(c, stream, letters))
        return {"connection_id": connection_id} | plan

    @api.post(f"{base}/dead-letters/{{stream}}/replay", dependencies=reading)
    async def replay_dead_letters(
        connection_id: str, stream: str, request: Request, user: GetUserDep
    ) -> dict[str, Any]:
        """Put the selected letters (``{"letters": ["0:17"]}``, or ``{"through": {"0": 999}}`` for
        all up to those offsets) back into their source streams, each once however often this is
        sent; recorded in Airflow's audit log."""
        await run_in_threadpool(_check_actions, user, connection_id)
        body = await _body(request)
        record: dict[str, Any] = {"connection_id": connection_id, "stream": stream}
        try:
            try:
                selection = actions.selection_from(stream, body)
            except SearchInputError as exc:
                raise HTTPException(status.HTTP_400_BAD_REQUEST, {"field": exc.field, "message": str(exc)}) from None
            record["selection"] = selection.describe()
            done = await off_loop(connection_id, lambda c: actions.replay(c, selection))
        except HTTPException as exc:
            await run_in_threadpool(audit, user, "liftbridge_replay_dead_letters", record | {"refused": _detail(exc)})
            raise
        keep = ("count", "replayed", "already_replayed", "targets")
        await run_in_threadpool(audit, user, "liftbridge_replay_dead_letters", record | {k: done[k] for k in keep})
        return {"connection_id": connection_id} | done

    @api.post(f"{base}/pipelines/{{dag_id}}/{{task_id}}/cursor", dependencies=reading[:1])
    async def move_cursor(
        connection_id: str, dag_id: str, task_id: str, request: Request, user: GetUserDep
    ) -> dict[str, Any]:
        """Move the pipeline's position (``{"offset": "1200"}`` or ``{"time": "2026-12-06T10:00Z"}``,
        optionally ``"partitions": [0, 2]`` and ``"map_index"``): its next run reads from there.
        Refused while the task is queued or running. Recorded in Airflow's audit log."""
        await run_in_threadpool(_check_actions, user, connection_id)
        await run_in_threadpool(_check_dag_edit, user, dag_id)
        body = await _body(request)
        record: dict[str, Any] = {
            "connection_id": connection_id,
            "offset": body.get("offset"),
            "time": body.get("time"),
        }
        try:
            busy = await run_in_threadpool(_busy_run, dag_id, task_id)
            if busy is not None:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    f"{dag_id}.{task_id} is queued or running in run {busy!r}: its commits would undo the move;"
                    " wait for it to end (or pause the DAG), then move the cursor",
                )
            done = await off_loop(connection_id, lambda c: _move(c, dag_id, task_id, body))
        except HTTPException as exc:
            await run_in_threadpool(
                audit, user, "liftbridge_move_cursor", record | {"refused": _detail(exc)}, dag_id, task_id
            )
            raise
        record |= {"stream": done["stream"], "cursor": done["cursor"], "moved": done["moved"]}
        await run_in_threadpool(audit, user, "liftbridge_move_cursor", record, dag_id, task_id)
        return {"connection_id": connection_id} | done


def _move(client: LiftbridgeClient, dag_id: str, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
    partitions = body.get("partitions")
    if partitions is not None and (
        not isinstance(partitions, list) or not all(isinstance(p, int) and p >= 0 for p in partitions)
    ):
        raise SearchInputError(
            "partition", "partitions must be a list of partition numbers, e.g. [0, 2] (or left out: all)"
        )
    map_index = body.get("map_index", -1)
    if not isinstance(map_index, int):
        raise SearchInputError("map_index", "map_index must be a whole number (-1: not mapped)")
    offset, time = body.get("offset"), body.get("time")
    at_offset, at_time = actions.parse_target(
        None if offset is None else str(offset), None if time is None else str(time)
    )
    entry = actions.find_pipeline(client, dag_id, task_id, map_index)
    return actions.move_cursor(client, entry, partitions=partitions, at_offset=at_offset, at_time=at_time)
