"""The base of the Liftbridge sensors: poke with the sync client, or defer to a trigger."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf

from airflow_provider_liftbridge.argument_checks import ArgumentChecks
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeTriggerEventError
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.operators.deferral import defer_unless_reached
from airflow_provider_liftbridge.triggers.base import LiftbridgeBaseTrigger
from airflow_provider_liftbridge.validation import bad_argument, check_name, waits_for_rendering

__all__ = ["LiftbridgeBaseSensor"]


class LiftbridgeBaseSensor(ArgumentChecks, BaseSensorOperator):
    """Poke with the sync client, or (``deferrable=True``) hand the wait to a trigger and free the
    worker slot. Either way the XCom value is the same.

    The sensor's ``timeout`` is passed to ``defer()``, so a deferred wait times out like a poking one;
    a deferrable sensor's ``timeout`` must be positive (``timeout=0`` would defer with no deadline).
    Before deferring it looks once (:meth:`check_before_deferring`, one poke): a target that is
    already reached finishes in the worker, without a trip through the triggerer
    (:func:`~airflow_provider_liftbridge.operators.deferral.defer_unless_reached`).
    Arguments are validated when the DAG is parsed and again after rendering, as the operators'
    (:class:`~airflow_provider_liftbridge.argument_checks.ArgumentChecks`).

    :param liftbridge_conn_id: the connection to use. (templated)
    :param deferrable: wait in the triggerer (default: ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = ("liftbridge_conn_id",)
    ui_color = "#d7ecfb"
    argument_checks = {"liftbridge_conn_id": check_name}

    def __init__(
        self,
        *,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        self.reject_unknown_arguments(kwargs)
        super().__init__(**kwargs)
        self.liftbridge_conn_id = liftbridge_conn_id
        self.deferrable = deferrable

    def check_combination(self, *, rendered: bool) -> None:
        """A deferrable sensor needs a positive ``timeout``: the trigger waits until it, and with
        ``timeout=0`` (or less) it would wait with no deadline at all."""
        if self.deferrable is True and not waits_for_rendering(self.timeout) and not self.timeout > 0:
            raise bad_argument(
                "timeout",
                self.timeout,
                "a deferrable sensor needs a positive timeout (seconds until it gives up)",
                "e.g. timeout=3600, or deferrable=False to poke",
            )

    @cached_property
    def hook(self) -> LiftbridgeHook:
        """The hook of :attr:`liftbridge_conn_id`."""
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    def prepare(self, context: Context) -> None:
        """Validate and resolve the (rendered) arguments before poking or deferring."""

    def make_trigger(self, context: Context) -> LiftbridgeBaseTrigger:
        """The trigger the deferrable path waits on."""
        raise NotImplementedError

    def check_before_deferring(self, context: Context) -> PokeReturnValue | bool:
        """One look at the condition before deferring (default: one :meth:`poke`); a sensor
        without a cheap check returns ``False`` (it then defers at once)."""
        return self.poke(context)

    def execute(self, context: Context) -> Any:
        self.import_functions()  # on the worker, before any I/O: a missing module fails the try at once
        try:
            self.prepare(context)
            if self.deferrable:
                return defer_unless_reached(
                    self,
                    check=lambda: self.check_before_deferring(context),
                    trigger=lambda: self.make_trigger(context),
                    timeout=timedelta(seconds=self.timeout),
                )
            return super().execute(context)
        finally:
            self.hook.close()

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Finish after the trigger fired: the XCom value on success.

        :raises LiftbridgeTriggerEventError: the trigger reported an error (its message is kept).
        """
        if not event or event.get("status") != "success":
            message = (event or {}).get("message", f"no usable event from the trigger: {event!r}")
            raise LiftbridgeTriggerEventError(f"{self.task_id}: {message}")
        try:
            return self.complete(context, {k: v for k, v in event.items() if k != "status"})
        finally:
            self.hook.close()

    def complete(self, context: Context, payload: dict[str, Any]) -> Any:
        """Turn a success event's payload into the XCom value (default: the payload itself)."""
        return payload
