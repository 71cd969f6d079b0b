"""The view's lag and consumer-group endpoints, added to its app by :func:`add_routes` (called by
:func:`.api.create_app`, which owns the auth and the client's worker thread).

Thresholds live in the Airflow Variable :data:`THRESHOLDS_VARIABLE` (Admin → Variables, or any
secrets backend Airflow reads Variables from), a JSON object per pipeline (``dag_id.task_id``)
or group (``group:<id>``): ``{"max_lag": <messages>, "max_lag_age_s": <seconds>}``. A Variable
that does not parse leaves every threshold unset, and the page says what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query
from starlette.concurrency import run_in_threadpool

from airflow_provider_liftbridge.client import LiftbridgeClient

from . import groups, lag, samples, verdicts

__all__ = ["THRESHOLDS_VARIABLE", "add_routes", "read_thresholds"]

#: The Airflow Variable holding the users' lag thresholds.
THRESHOLDS_VARIABLE = "liftbridge_lag_thresholds"

OffLoop = Callable[[str, Callable[[LiftbridgeClient], Any]], Awaitable[Any]]


def read_thresholds() -> tuple[dict[str, lag.Thresholds], str | None]:
    """The thresholds of :data:`THRESHOLDS_VARIABLE` (none when it is not set), and what is
    wrong with it (``None``: nothing). Blocks (a metastore or secrets-backend read)."""
    from airflow.models.variable import Variable  # the api-server's own Variable (not the task SDK's)

    raw = Variable.get(THRESHOLDS_VARIABLE, default_var=None)
    if raw is None:
        return {}, None
    try:
        return lag.parse_thresholds(json.loads(raw)), None
    except ValueError as exc:  # JSONDecodeError too
        return {}, f"Airflow Variable {THRESHOLDS_VARIABLE!r} is not used: {exc}"


def _thresholds_answer(error: str | None) -> dict[str, Any]:
    return {"thresholds_variable": THRESHOLDS_VARIABLE, "thresholds_error": error}


def add_routes(api: FastAPI, off_loop: OffLoop, dependencies: list[Any]) -> None:
    """The lag and groups endpoints, each behind ``dependencies`` (reading the connection)."""

    @api.get("/api/connections/{connection_id}/lag", dependencies=dependencies)
    async def lag_overview(connection_id: str) -> dict[str, Any]:
        """Every pipeline's and group's lag (messages, oldest unread message's age), verdict
        (OK / WARN / STALL / STOP / ERR), threshold and lag between runs."""
        limits, error = await run_in_threadpool(read_thresholds)
        body = await off_loop(connection_id, lambda c: verdicts.overview(c, limits))
        return {"connection_id": connection_id} | _thresholds_answer(error) | body

    @api.get("/api/connections/{connection_id}/groups", dependencies=dependencies)
    async def consumer_groups(
        connection_id: str,
        group: Annotated[list[str] | None, Query(description="groups to show besides the known ones")] = None,
    ) -> dict[str, Any]:
        """Every known consumer group: coordinator, epoch, members and their assignments, and per
        partition the group's position, lag, its age, owner and verdict."""
        limits, error = await run_in_threadpool(read_thresholds)

        def work(client: LiftbridgeClient) -> dict[str, Any]:
            known = samples.read_samples(client)
            found, fresh = groups.groups(client, asked=group or (), thresholds=limits, known=known)
            samples.take_samples(client, known, fresh)
            return {"groups": found}

        return {"connection_id": connection_id} | _thresholds_answer(error) | await off_loop(connection_id, work)
