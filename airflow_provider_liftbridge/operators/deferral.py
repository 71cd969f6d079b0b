"""Check once, then defer: a deferrable task whose condition already holds finishes at once.

Deferring costs a trip through the triggerer and a resumed attempt, and on Airflow 3.3.2 a trigger
that fires right after its task deferred can get the resumed attempt killed (apache/airflow#72716).
So every deferrable sensor and operator here asks the cluster once, cheaply, before it defers, and
finishes in the worker when the answer is already "yes" (as Airflow's own deferrable sensors do).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, PokeReturnValue
from airflow.triggers.base import BaseTrigger

__all__ = ["DEFERRING", "NOT_DEFERRING", "Check", "defer_unless_reached"]

#: Logged when the check found the target reached and the task finishes without deferring.
NOT_DEFERRING = "target already reached: not deferring"
#: Logged when the task hands its wait to the triggerer.
DEFERRING = "deferring to the triggerer"

#: One look at the condition: ``PokeReturnValue`` (``is_done`` + the XCom value) or a bool.
Check = Callable[[], "PokeReturnValue | bool"]


def defer_unless_reached(
    task: BaseOperator,
    *,
    check: Check | None,
    trigger: BaseTrigger | Callable[[], BaseTrigger],
    timeout: timedelta | None = None,
    method_name: str = "execute_complete",
) -> Any:
    """Look at the condition once with ``check``; if it holds, return its XCom value, else defer.

    ``check`` must be one cheap round trip (a metadata read, one bounded read of what is committed
    now), never a polling loop: waiting is the trigger's job. Give ``None`` when no such check
    exists (e.g. NATS acks, which have no history): the task then defers at once.

    If ``check`` raises, the task defers as it would have without the check: the trigger (which
    handles retries and reports errors) stays the one judge of failure, so the check can only
    shorten a wait, never fail a task. ``trigger`` may be a callable, built only when deferring
    (after the check, so it can start where the check stopped reading).

    :param task: the running operator or sensor (its ``defer`` and ``log`` are used).
    :param check: one look at the condition, or ``None``.
    :param trigger: the trigger to wait on, or a callable returning it.
    :param timeout: passed to ``defer()``.
    :param method_name: the method the resumed task calls with the trigger's event.
    :return: the check's XCom value (``PokeReturnValue.xcom_value``; ``None`` for ``True``).
    :raises TaskDeferred: the condition does not hold yet (raised by ``task.defer``).
    """
    if check is not None:
        try:
            result = check()
        except Exception as error:  # noqa: BLE001 - any failure of the check means "wait as before"
            task.log.warning(
                "checking before deferring failed (%s: %s): the trigger waits instead", type(error).__name__, error
            )
        else:
            if result:  # PokeReturnValue is truthy when done
                task.log.info(NOT_DEFERRING)
                return result.xcom_value if isinstance(result, PokeReturnValue) else None
    task.log.info(DEFERRING)
    task.defer(  # raises TaskDeferred
        trigger=trigger if isinstance(trigger, BaseTrigger) else trigger(),
        method_name=method_name,
        timeout=timeout,
    )
