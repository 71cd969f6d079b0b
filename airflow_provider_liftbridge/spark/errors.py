"""Errors raised by the Spark room: one base class, subclasses named for what happened."""

from __future__ import annotations


class LiftbridgeSparkError(Exception):
    """Base class of every error raised by :mod:`airflow_provider_liftbridge.spark`."""


class SparkOptionError(LiftbridgeSparkError, ValueError):
    """An argument or data source option is missing, unknown or has a bad value.

    The message names the option and says what values are accepted.
    """


class SparkStreamError(LiftbridgeSparkError):
    """The target stream cannot be used: it does not exist, or a partition is missing.

    Raised on the driver before any row is published or read.
    """


class SparkDataLossError(SparkStreamError):
    """A streaming query's checkpoint no longer matches its stream (recreated, an offset beyond the
    newest, messages removed by retention): reading on would skip or re-read messages.

    The message names the stream, what changed, and the two ways out (a new checkpoint, or the
    ``failOnDataLoss=false`` source option).
    """


class SparkPublishError(LiftbridgeSparkError):
    """At least one row was not acknowledged by Liftbridge.

    :param stream: the stream being published to.
    :param failures: one line per failed Spark partition, naming the stream partition, how many
        rows of that Spark partition had been acknowledged before the failure, and what happened.
    :param acked_rows: rows acknowledged across the whole job (including the failed partitions'
        acknowledged prefix); these are durable in the stream and are not rolled back.
    :param replaced_history: an exactly-once task found the stream's history replaced (the
        client's ``ReplacedHistoryError``): the Airflow operator then fails without retries.
    """

    def __init__(self, stream: str, failures: list[str], acked_rows: int, *, replaced_history: bool = False) -> None:
        self.stream = stream
        self.failures = list(failures)
        self.acked_rows = acked_rows
        self.replaced_history = replaced_history
        lines = "\n  ".join(self.failures)
        super().__init__(
            f"publishing to stream {stream!r} failed in {len(self.failures)} Spark partition(s) "
            f"({acked_rows} row(s) were acknowledged and stay in the stream):\n  {lines}"
        )


class SparkReadError(LiftbridgeSparkError):
    """Reading a stream partition into Spark failed (names the stream, partition and offsets)."""
