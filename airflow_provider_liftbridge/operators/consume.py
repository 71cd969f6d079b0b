"""``LiftbridgeConsumeOperator``: read a stream (what arrived since the last run, a consumer
group's share, or a data interval: ``read``) and hand it to a function, per message or per batch,
with retry-safe planned ranges (see ``docs/consume.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_provider_liftbridge.client import LiftbridgeClient, Message
from airflow_provider_liftbridge.client.reading import (
    COMMIT_CADENCES,
    VALUE_FORMATS,
    BatchFailed,
    BatchHandler,
    DeadLetters,
    json_value,
    text_value,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_choice,
    check_function,
    import_function,
    optional,
)

from .dead_letters import open_dead_letters
from .reading_base import LiftbridgeReadingOperator

__all__ = [
    "VALUE_FORMATS",
    "LiftbridgeConsumeOperator",
    "check_args",
    "check_kwargs",
]


def check_args(value: Any, name: str) -> list[Any]:
    """Positional arguments: a list or tuple (``None``: none).

    :raises LiftbridgeArgumentError: anything else (a string would be spread into characters).
    """
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise bad_argument(name, value, "a list of positional arguments", f"e.g. {name}=['orders']")
    return list(value)


def check_kwargs(value: Any, name: str) -> dict[str, Any]:
    """Keyword arguments: a dict (``None``: none).

    :raises LiftbridgeArgumentError: anything else.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise bad_argument(name, value, "a dict of keyword arguments", f"e.g. {name}={{'table': 'orders'}}")
    return dict(value)


def _decoded(message: Message) -> Message:
    """The message with its value decoded from JSON (``NotJsonError`` names the offset)."""
    return dataclasses.replace(message, value=json_value(message))


def _as_text(message: Message) -> Message:
    """The message with its value decoded as UTF-8 (``NotTextError`` names the offset)."""
    return dataclasses.replace(message, value=text_value(message))


#: How each value format hands a message over (``None``: as stored).
_DECODERS: dict[str, Callable[[Message], Message] | None] = {"bytes": None, "text": _as_text, "json": _decoded}


class LiftbridgeConsumeOperator(LiftbridgeReadingOperator):
    """Read a stream as ``read`` says and call a function on what was read.

    Exactly one of ``apply_function`` (called with each message) and ``apply_function_batch``
    (called with a list of up to ``batch_size`` messages) is given; either is a callable or a
    dotted path, and gets ``apply_function_args`` / ``apply_function_kwargs`` after the message(s).
    A dotted path is checked for its shape when the DAG is parsed and imported on the worker when
    the task runs (before anything is read), so its module need not exist where DAGs are parsed.
    A message is the client's :class:`~airflow_provider_liftbridge.client.Message` (``stream``,
    ``partition``, ``offset``, ``key``, ``value``, ``headers``, ``timestamp``).

    What to read (``read``, ``partitions``), the planned ranges, batches, waiting and dead
    letters: see :class:`~.reading_base.LiftbridgeReadingOperator` and ``docs/consume.md``.

    :param apply_function: the per-message function (a callable or a dotted path).
    :param apply_function_batch: the per-batch function (a callable or a dotted path).
    :param apply_function_args: positional arguments after the message(s). (templated)
    :param apply_function_kwargs: keyword arguments. (templated)
    :param value_format: ``"bytes"`` (default): values as stored; ``"text"``: decoded as UTF-8;
        ``"json"``: decoded from JSON (a value that is not text or JSON fails like a raising
        function, naming its offset).
    :param commit_cadence: when positions move: ``"end_of_batch"`` (default), ``"end_of_operator"``
        (once every partition's plan is done) or ``"never"``.
    :param dead_letters: ``None`` (default): a raising function fails the task, the position
        stays before the message; a :class:`~.dead_letters.DeadLetterStream`: the message goes
        to its stream with the error in its headers, and processing goes on (a raising batch
        function sends its whole batch). (templated: its ``stream``)
    :return: ``{"stream", "cursor_id" | "group_id", "partitions": {"<p>": {"first_offset",
        "last_offset", "processed", "dead_lettered", "committed", "plan_end", "resumed", "lag"}},
        "processed", "dead_lettered"}``; with ``DataInterval`` also ``"interval"``, each
        partition's ``"interval_first_offset"`` and ``"empty"`` when the interval holds nothing.
    :raises LiftbridgeArgumentError: a bad argument (at parse time when not templated), or a
        function that cannot be imported on the worker (when the task starts, before any read).
    """

    template_fields: Sequence[str] = (
        *LiftbridgeReadingOperator.template_fields,
        "apply_function_args",
        "apply_function_kwargs",
    )
    argument_checks = {
        "apply_function": optional(check_function),
        "apply_function_batch": optional(check_function),
        "apply_function_args": check_args,
        "apply_function_kwargs": check_kwargs,
        "value_format": check_choice(VALUE_FORMATS),
        "commit_cadence": check_choice(COMMIT_CADENCES),
    }
    function_arguments = ("apply_function", "apply_function_batch")

    def __init__(
        self,
        *,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_batch: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        value_format: str = "bytes",
        commit_cadence: str = "end_of_batch",
        **kwargs: Any,
    ) -> None:
        self.apply_function = apply_function
        self.apply_function_batch = apply_function_batch
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.value_format = value_format
        self.commit_cadence = commit_cadence
        super().__init__(**kwargs)

    def check_arguments(self, *, rendered: bool) -> None:
        """The reading arguments' combination, and: exactly one function (each argument alone is
        checked by ``argument_checks``).

        :raises LiftbridgeArgumentError: the argument at fault is named, with the fix.
        """
        super().check_arguments(rendered=rendered)
        given = [n for n in ("apply_function", "apply_function_batch") if getattr(self, n) is not None]
        if len(given) != 1:
            raise LiftbridgeArgumentError(
                "give exactly one of apply_function (called per message) and apply_function_batch (called per batch"
                f" of up to batch_size messages); got {'both' if given else 'neither'}"
            )

    def make_handler(self, client: LiftbridgeClient, context: Context) -> BatchHandler:
        """The per-message or per-batch handler, with decoding and dead letters as asked.

        :raises NoSuchStreamError: the dead-letter stream does not exist (and is not to be created).
        """
        dead_letters = open_dead_letters(client, self.dead_letters)
        args = check_args(self.apply_function_args, "apply_function_args")
        kwargs = check_kwargs(self.apply_function_kwargs, "apply_function_kwargs")
        decode = _DECODERS[str(self.value_format)]
        if self.apply_function is not None:
            func = import_function(self.apply_function, "apply_function")
            return _per_message(func, args, kwargs, decode, dead_letters)
        func = import_function(self.apply_function_batch, "apply_function_batch")
        return _per_batch(func, args, kwargs, decode, dead_letters)

    def describe_failure(self, failed: BatchFailed) -> str:
        m = failed.message
        what = "apply_function" if self.apply_function is not None else "apply_function_batch"
        return (
            f"{what} failed at stream {m.stream!r} partition {m.partition} offset {m.offset}: {failed}. The position"
            " stays before this message, so the next try starts there; give dead_letters=DeadLetterStream(...) to"
            " set such messages aside instead"
        )

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the stream; writes the dead-letter stream when there is one."""
        inputs, _ = super().lineage_datasets(complete=complete)
        dead = self.dead_letter_target()
        return inputs, [self.lineage_stream(dead)] if dead else []


Decode = Callable[[Message], Message] | None


def _failure(done: int, message: Message, exc: BaseException) -> BatchFailed:
    failed = BatchFailed(done, message, f"{type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


def _per_message(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], decode: Decode, dead: DeadLetters | None
) -> BatchHandler:
    def handle(batch: list[Message]) -> int:
        sent = 0
        for index, message in enumerate(batch):
            try:
                func(decode(message) if decode else message, *args, **kwargs)
            except Exception as exc:
                if dead is None:
                    raise _failure(index, message, exc) from exc
                dead.send(message, exc)
                sent += 1
        return sent

    return handle


def _per_batch(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], decode: Decode, dead: DeadLetters | None
) -> BatchHandler:
    def handle(batch: list[Message]) -> int:
        sent = 0
        taken, ready = batch, batch  # the stored messages the function gets, and what it gets of them
        if decode is not None:
            taken, ready = [], []
            for message in batch:
                try:
                    ready.append(decode(message))
                except ValueError as exc:
                    if dead is None:
                        raise _failure(0, message, exc) from exc  # nothing of this batch was processed
                    dead.send(message, exc)
                    sent += 1
                else:
                    taken.append(message)
        if not ready:
            return sent
        try:
            func(ready, *args, **kwargs)
        except Exception as exc:
            if dead is None:
                raise _failure(0, batch[0], exc) from exc
            for message in taken:
                dead.send(message, exc)
            sent += len(taken)
        return sent

    return handle
