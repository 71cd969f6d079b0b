"""Drive the client's sans-I/O operations against a scripted answerer, without any network.

The operations are generators of effects (see ``client/_effects.py``); here a test function
answers each effect, so retry, routing and resubscription logic can be checked step by step
and deterministically. Transport behaviour itself is tested against the dev server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_liftbridge.client._core import ReadTimeout, RpcFailure
from airflow_provider_liftbridge.client._effects import Effect, Emit, Op


class Run:
    """The record of one driven operation: every effect, every emitted item, the result."""

    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self.emitted: list[Any] = []
        self.result: Any = None


def drive(op: Op[Any], answer: Callable[[Effect], Any], *, run: Run | None = None, limit: int = 10_000) -> Run:
    """Run ``op``; ``answer(effect)`` returns the effect's result or raises RpcFailure/ReadTimeout.
    Pass ``run`` to keep the record when the operation raises."""
    run = run if run is not None else Run()
    send: Any = None
    error: BaseException | None = None
    for _ in range(limit):
        try:
            effect = op.throw(error) if error is not None else op.send(send)
        except StopIteration as stop:
            run.result = stop.value
            return run
        send, error = None, None
        run.effects.append(effect)
        if isinstance(effect, Emit):
            run.emitted.append(effect.item)
            continue
        try:
            send = answer(effect)
        except (RpcFailure, ReadTimeout) as exc:
            error = exc
    raise AssertionError("operation did not finish within the effect limit")
