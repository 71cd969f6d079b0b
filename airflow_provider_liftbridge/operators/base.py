"""The base every Liftbridge operator builds on: connection id, hook, client lifetime."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_liftbridge.argument_checks import ArgumentChecks
from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import producer_id_for
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.validation import check_name, check_stream

__all__ = ["LiftbridgeBaseOperator", "producer_id_of"]


def producer_id_of(context: Context, given: str | None = None) -> str:
    """The exactly-once producer id of the running task: ``given``, else
    ``dag_id/task_id/run_id[/map_index]``, which stays the same across retries of one run."""
    if given:
        return given
    ti = context["ti"]
    return producer_id_for(ti.dag_id, ti.task_id, context["run_id"], getattr(ti, "map_index", None))


class LiftbridgeBaseOperator(ArgumentChecks, BaseOperator):
    """Run one piece of work against a stream with the client of a ``liftbridge`` connection.

    Subclasses implement :meth:`run`; the client is closed when it returns or raises. Arguments
    are validated when the DAG is parsed (literal values, once the operator is built, whatever the
    subclass) and again once templates are rendered
    (:class:`~airflow_provider_liftbridge.argument_checks.ArgumentChecks`): a subclass lists its
    parameters' validators in ``argument_checks``. Parameters naming a function
    (``function_arguments``) are imported first thing in :meth:`execute`, on the worker, never when
    the DAG is parsed.

    :param stream: the stream's name. (templated)
    :param liftbridge_conn_id: the connection to use. (templated)
    """

    template_fields: Sequence[str] = ("stream", "liftbridge_conn_id")
    ui_color = "#e8f1fb"
    argument_checks = {"stream": check_stream, "liftbridge_conn_id": check_name}

    def __init__(self, *, stream: str, liftbridge_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        self.reject_unknown_arguments(kwargs)
        super().__init__(**kwargs)
        self.stream = stream
        self.liftbridge_conn_id = liftbridge_conn_id

    @cached_property
    def hook(self) -> LiftbridgeHook:
        """The hook of :attr:`liftbridge_conn_id`."""
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    def execute(self, context: Context) -> Any:
        self.import_functions()  # on the worker, before any I/O: a missing module fails the try at once
        try:
            return self.run(self.hook.client, context)
        finally:
            self.hook.close()

    def run(self, client: LiftbridgeClient, context: Context) -> Any:
        """Do the operator's work with ``client``; the return value becomes the XCom value."""
        raise NotImplementedError
