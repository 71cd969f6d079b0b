"""``DeadLetterStream``: where the reading operators set aside what they cannot process, as one value.

``dead_letters=DeadLetterStream("orders-dlq", create=True)`` on
:class:`~airflow_provider_liftbridge.operators.consume.LiftbridgeConsumeOperator` and
:class:`~airflow_provider_liftbridge.operators.stream_to_file.LiftbridgeStreamToFileOperator`
says it all: a message that cannot be processed goes to that stream (with why, in its headers)
and the read goes on; without it, such a message fails the task.

A ``NamedTuple``, so it is immutable and Airflow renders it when it is a templated field: its
``stream`` may be a Jinja template (each element is rendered, the value rebuilt).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import DeadLetters
from airflow_provider_liftbridge.validation import bad_argument, check_bool, check_stream

__all__ = ["DeadLetterStream", "check_dead_letters", "open_dead_letters"]


class DeadLetterStream(NamedTuple):
    """The dead-letter stream of a reading operator.

    :param stream: the stream dead letters are published to (each acknowledged before the
        position moves past its message). (templated, as part of ``dead_letters``)
    :param create: create it (one partition) when it is missing; default: a missing one is an
        error before anything is read.
    """

    stream: str
    create: bool = False


def check_dead_letters(value: Any, name: str = "dead_letters") -> DeadLetterStream | None:
    """``None`` (no dead letters: a failure fails the task) or a :class:`DeadLetterStream` with a
    valid stream name and a boolean ``create``.

    :raises LiftbridgeArgumentError: anything else, naming the fix.
    """
    if value is None:
        return None
    if not isinstance(value, DeadLetterStream):
        raise bad_argument(
            name, value, "a DeadLetterStream value or None", f"e.g. {name}=DeadLetterStream('orders-dlq', create=True)"
        )
    return DeadLetterStream(check_stream(value.stream, f"{name}.stream"), check_bool(value.create, f"{name}.create"))


def open_dead_letters(client: LiftbridgeClient, value: Any) -> DeadLetters | None:
    """The client's dead-letter publisher for a ``dead_letters`` value (``None``: none), its stream
    checked (and created, if asked) before anything is read.

    :raises LiftbridgeArgumentError: not a valid value.
    :raises NoSuchStreamError: the dead-letter stream does not exist (and is not to be created).
    """
    given = check_dead_letters(value)
    if given is None:
        return None
    dead = DeadLetters(client, given.stream)
    dead.check(create=given.create)
    return dead
