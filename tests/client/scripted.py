"""Drive the client's sans-I/O operations against a scripted answerer, without any network.

The operations are generators of effects (see ``client/effects.py``); here a test function
answers each effect, so retry, routing and resubscription logic can be checked step by step
and deterministically. Transport behaviour itself is tested against the dev server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.effects import END, Effect, Emit, Op, Pump, Read, ReadTimeout, RpcFailure, Sleep


class VirtualClock:
    """A clock for ``ClientCore.clock`` that only moves when :func:`drive` answers a ``Sleep``:
    retry budgets bounded by time run out after the backoffs they asked for, without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Run:
    """The record of one driven operation: every effect, every emitted item, the result."""

    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self.emitted: list[Any] = []
        self.result: Any = None


def drive(
    op: Op[Any],
    answer: Callable[[Effect], Any],
    *,
    run: Run | None = None,
    limit: int = 10_000,
    clock: VirtualClock | None = None,
) -> Run:
    """Run ``op``; ``answer(effect)`` returns the effect's result or raises RpcFailure/ReadTimeout.
    Pass ``run`` to keep the record when the operation raises, ``clock`` (the core's) to have each
    ``Sleep`` move it on."""
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
        if clock is not None and isinstance(effect, Sleep):
            clock.advance(effect.seconds)
        try:
            send = _pump(effect, answer, run) if isinstance(effect, Pump) else answer(effect)
        except (RpcFailure, ReadTimeout) as exc:
            error = exc
    raise AssertionError("operation did not finish within the effect limit")


def _pump(pump: Pump, answer: Callable[[Effect], Any], run: Run) -> Any:
    """What the transports do for a Pump, with ``answer`` standing in for the stream: ``Read``
    after ``Read`` (each recorded like any effect) until the sink is done or the stream ends."""
    while True:
        read = Read(pump.handle)
        run.effects.append(read)
        response = answer(read)
        if response is END:
            return END
        item = pump.sink.take(response)
        if item is not None:
            run.emitted.append(item)
            if pump.sink.done:
                return None


class ScriptedTransport:
    """A client transport whose every effect is answered by ``answer`` (``Sleep`` included, so a
    test can keep a virtual clock): a real :class:`LiftbridgeClient`, its operations unchanged,
    with the network replaced by a script. Built by :func:`scripted_client`."""

    def __init__(self) -> None:
        self.answer: Callable[[Effect], Any] = _unanswered
        self.effects: list[Effect] = []

    def close(self) -> None:
        pass

    def drive(self, op: Op[Any]) -> Iterator[Any]:
        """What the real transports' ``drive`` does: yield emitted (and pumped) items, return the result."""
        send: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    effect = op.throw(error) if error is not None else op.send(send)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                send, error = None, None
                self.effects.append(effect)
                if isinstance(effect, Emit):
                    yield effect.item
                    continue
                try:
                    if isinstance(effect, Pump):
                        send = yield from self._pump(effect)
                    else:
                        send = self.answer(effect)
                except (RpcFailure, ReadTimeout) as exc:
                    error = exc
        finally:
            op.close()

    def run(self, op: Op[Any]) -> Any:
        """What the real transports' ``run`` does: execute a unary operation, return its result."""
        driver = self.drive(op)
        try:
            item = next(driver)
        except StopIteration as stop:
            return stop.value
        raise AssertionError(f"{op!r} emitted {item!r}; it is not a unary operation")

    def _pump(self, pump: Pump) -> Iterator[Any]:
        while True:
            read = Read(pump.handle)
            self.effects.append(read)
            response = self.answer(read)
            if response is END:
                return END
            item = pump.sink.take(response)
            if item is not None:
                yield item
                if pump.sink.done:
                    return None


def _unanswered(effect: Effect) -> Any:
    raise AssertionError(f"no answer set for {effect!r}")


def scripted_client(answer: Callable[[Effect], Any], brokers: str = "a:1", **options: Any) -> LiftbridgeClient:
    """A blocking client whose I/O is ``answer(effect)`` (see :class:`ScriptedTransport`)."""

    class _Scripted(LiftbridgeClient):
        def _open(self, factory: Any, subscription_channels: int) -> None:
            self._transport = ScriptedTransport()  # type: ignore[assignment]

    client = _Scripted(brokers, **options)
    client._transport.answer = answer  # type: ignore[attr-defined]
    return client
