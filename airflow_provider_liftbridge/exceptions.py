"""Errors of the Airflow layer (hooks, operators, sensors, triggers, queues): one neutral module
that every Airflow room imports, instead of each reaching into the hooks.

They share one base, :class:`LiftbridgeAirflowError`, which is an ``AirflowException`` so Airflow
fails the task with the message. Errors of the client (``LiftbridgeError`` and its subclasses)
pass through unchanged: they already say what the server refused.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_liftbridge.connection_fields import field_label

__all__ = [
    "LiftbridgeAirflowError",
    "LiftbridgeConnectionConfigError",
    "LiftbridgeArgumentError",
    "LiftbridgeUnknownArgumentError",
    "LiftbridgePublishNotAcknowledgedError",
    "LiftbridgeReplacedHistoryError",
    "LiftbridgeFileError",
    "LiftbridgeTriggerEventError",
]


class LiftbridgeAirflowError(AirflowException):
    """Base class of every error raised by the provider's hooks, operators, sensors and triggers."""


class LiftbridgeConnectionConfigError(LiftbridgeAirflowError, ValueError):
    """An Airflow connection of type ``liftbridge`` has a missing or invalid field.

    The message names the field by its label in the connection form ("Call timeout (seconds)").

    :param conn_id: the connection id.
    :param field: the field at fault, as stored (``host``, ``port``, ``extra.tls_ca_file``, ...).
    :param problem: what is wrong and what to do about it.
    :ivar label: the field's label in the connection form.
    """

    def __init__(self, conn_id: str, field: str, problem: str) -> None:
        self.conn_id = conn_id
        self.field = field
        self.problem = problem
        self.label = field_label(field.removeprefix("extra."))
        super().__init__(f"Liftbridge connection {conn_id!r}, field {self.label!r}: {problem}")

    def form_message(self) -> str:
        """The message without the connection id (the connection Test runs under a temporary id
        that means nothing to the user)."""
        return f"field {self.label!r}: {self.problem}"


class LiftbridgeArgumentError(LiftbridgeAirflowError, ValueError):
    """An operator, sensor or trigger was given an invalid argument (the message names it)."""


class LiftbridgeUnknownArgumentError(LiftbridgeArgumentError, TypeError):
    """An operator or sensor was given a keyword it does not take (the message names the closest
    parameter). A ``TypeError`` too, like Airflow's own "Invalid arguments were passed"."""


class LiftbridgePublishNotAcknowledgedError(LiftbridgeAirflowError):
    """The server did not acknowledge every record a task published.

    :param stream: the stream published to.
    :param acknowledged: how many records were acknowledged before the failure.
    :param detail: which record failed and why.
    """

    def __init__(self, stream: str, acknowledged: int, detail: str) -> None:
        self.stream = stream
        self.acknowledged = acknowledged
        super().__init__(
            f"publishing to stream {stream!r} failed after {acknowledged} acknowledged record(s): {detail}"
        )


class LiftbridgeReplacedHistoryError(LiftbridgeAirflowError, AirflowFailException):
    """An exactly-once publish found that Liftbridge replaced a partition's history (the client's
    ``ReplacedHistoryError``: ``TruncatedLogError`` or ``HistoryMismatchError``, or a Spark task
    that raised one). An ``AirflowFailException``: the task fails without Airflow's retries,
    because a retry re-sends what the current leader lacks, and where a replica keeps the other
    history those records are then stored twice (seed 59919, ADR 8). A human compares the
    replicas first (docs/exactly-once.md, "A replaced history").

    :param stream: the stream published to.
    :param producer_id: the exactly-once producer id (a Spark job's: the prefix of its tasks').
    :param found: what was found: the client's error message.
    """

    def __init__(self, stream: str, producer_id: str, found: str) -> None:
        self.stream = stream
        self.producer_id = producer_id
        super().__init__(
            f"exactly-once publishing to stream {stream!r} as producer {producer_id!r} found the stream's history "
            f"replaced, so the task fails without retries (a retry would send again what the current leader lacks, "
            f"and a replica that kept the other history would then hold those records twice). What was found: "
            f"{found.rstrip('.')}. What to do: compare the partition's replicas as docs/exactly-once.md says (every "
            f"broker names the same leader; each replica holds the same records of producer {producer_id!r}); if "
            f"they agree, clear the task to resume with the same producer id (it skips what is stored and sends "
            f"the rest); if they differ, the stream holds two histories: leave the task failed and repair the "
            f"stream by hand (e.g. republish the input to a new stream), since no publish can make both right."
        )


class LiftbridgeFileError(LiftbridgeAirflowError):
    """A file to publish could not be found or read, or a record in it is malformed (the message
    names the file and the record number)."""


class LiftbridgeTriggerEventError(LiftbridgeAirflowError):
    """A trigger reported ``{"status": "error"}``; the message is the trigger's."""
