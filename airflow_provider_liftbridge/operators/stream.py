"""Stream administration: create, delete, pause, make read-only.

Forgiving by default where repeating an action is harmless: creating a stream that exists and
deleting one that does not are logged, not fatal (``fail_if_exists`` / ``fail_if_missing`` make
them fatal). Each operator returns a small JSON-safe dict describing what it did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    NoSuchPartitionError,
    NoSuchStreamError,
    StreamExistsError,
    StreamOptions,
)
from airflow_provider_liftbridge.client.checks import check_partition_count
from airflow_provider_liftbridge.client.stream_options import STREAM_OPTION_NAMES
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError
from airflow_provider_liftbridge.validation import (
    airflow_check,
    bad_argument,
    check_bool,
    check_partition_list,
    check_subject,
)

from .base import LiftbridgeBaseOperator

__all__ = [
    "LiftbridgeCreateStreamOperator",
    "LiftbridgeDeleteStreamOperator",
    "LiftbridgePauseStreamOperator",
    "LiftbridgeSetStreamReadonlyOperator",
]

#: How ``partitions`` is read: a literal or a rendered template (digit strings), the option's own check.
_check_partitions = airflow_check(check_partition_count)


def check_stream_options_argument(value: Any, name: str = "options") -> StreamOptions | None:
    """``value`` if it is a :class:`StreamOptions` (or ``None``) that leaves ``partitions`` at its
    default: the operator takes the partition count as its own (templated) keyword.

    :raises LiftbridgeArgumentError: another type, or ``partitions`` set in the options.
    """
    if value is None:
        return None
    if not isinstance(value, StreamOptions):
        raise bad_argument(
            name, value, "a StreamOptions value is required", f"e.g. {name}=StreamOptions(replication_factor=3)"
        )
    if value.partitions != StreamOptions().partitions:
        raise bad_argument(
            name, value, "the operator says this itself, not options.partitions", "give partitions=N to the operator"
        )
    return value


#: Each stream option but ``partitions`` was once a keyword of its own: now only in ``options``.
_REMOVED_OPTION_KEYWORDS = {
    name: f"options=StreamOptions({name}=...)" for name in STREAM_OPTION_NAMES if name != "partitions"
}


@contextlib.contextmanager
def _missing_partitions_named(client: LiftbridgeClient, stream: str, partitions: list[int] | None) -> Iterator[None]:
    """Liftbridge answers NOT_FOUND for a missing stream and for a missing partition alike; when
    the stream is there, say which partitions it lacks.

    :raises NoSuchPartitionError: the stream exists but lacks some of ``partitions``.
    """
    try:
        yield
    except NoSuchStreamError:
        info = client.fetch_metadata([stream]).streams.get(stream) if partitions else None
        if info is None:
            raise
        missing = sorted(set(partitions or ()) - set(info.partitions))
        raise NoSuchPartitionError(
            f"stream {stream!r} has no partition {', '.join(map(str, missing))}: it has partitions "
            f"0 to {len(info.partitions) - 1}; fix partitions (or leave it unset for all)"
        ) from None


class LiftbridgeCreateStreamOperator(LiftbridgeBaseOperator):
    """Create a stream, accepting one that already exists unless ``fail_if_exists``.

    An existing stream attached to a different subject is an error either way: publishing to the
    subject the task asked for would reach no stream.

    :param stream: the stream's name. (templated)
    :param subject: the NATS subject it is attached to (default: the stream's name). (templated)
    :param partitions: the number of partitions (partition N listens on ``subject.N``; 0 means 1).
        (templated)
    :param options: a :class:`~airflow_provider_liftbridge.client.StreamOptions`: every other way
        the stream is made (default: the server's defaults, 1 copy). Its ``partitions`` is refused:
        give ``partitions`` to the operator. ``replication_factor=0`` is taken as ``1``, as
        Liftbridge does (0 is "not set" on its API); more than the cluster's brokers is refused by
        the server when the task runs.
    :param fail_if_exists: raise when the stream already exists (default: log and go on).
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "subject", "partitions", "created"}``; ``created`` is false when it existed.
    :raises StreamExistsError: the stream exists and ``fail_if_exists`` is set.
    :raises LiftbridgeAirflowError: the stream exists with another subject.
    :raises LiftbridgeArgumentError: an invalid argument (when the DAG is parsed for literal values).
    :raises LiftbridgeUnknownArgumentError: a stream option given as a keyword of its own (naming
        the ``options=StreamOptions(...)`` form to write).
    """

    template_fields: Sequence[str] = ("stream", "subject", "partitions", "liftbridge_conn_id")
    argument_checks = {
        "subject": check_subject,
        "partitions": _check_partitions,
        "options": check_stream_options_argument,
        "fail_if_exists": check_bool,
    }
    removed_arguments = _REMOVED_OPTION_KEYWORDS

    def __init__(
        self,
        *,
        stream: str,
        subject: str | None = None,
        partitions: int | str = 1,
        options: StreamOptions | None = None,
        fail_if_exists: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.subject = subject
        self.partitions = partitions
        self.options = options
        self.fail_if_exists = fail_if_exists

    def create_options(self) -> StreamOptions:
        """The stream options of this task: ``options`` with the (rendered) ``partitions``.

        :raises LiftbridgeArgumentError: a bad value (the checks already ran when it was rendered).
        """
        options = check_stream_options_argument(self.options) or StreamOptions()
        partitions = _check_partitions(self.partitions, "partitions")
        return options.replace(partitions=partitions, replication_factor=options.replication_factor or 1)  # 0: 1

    def stream_options(self) -> dict[str, Any]:
        """The options this operator sets, by name (those left at their defaults left out)."""
        return self.create_options().changed()

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        subject = self.subject or self.stream
        options = self.create_options()
        partitions = options.partitions
        try:
            client.create_stream(subject, self.stream, options)
        except StreamExistsError:
            if self.fail_if_exists:
                raise
            return self._existing(client, subject, partitions)
        self.log.info("Created stream %r on subject %r with %d partition(s)", self.stream, subject, partitions)
        return {"stream": self.stream, "subject": subject, "partitions": max(partitions, 1), "created": True}

    def _existing(self, client: LiftbridgeClient, subject: str, partitions: int) -> dict[str, Any]:
        info = client.fetch_metadata([self.stream]).streams.get(self.stream)
        if info is None:  # deleted between the two calls: report what we know
            self.log.warning("Stream %r existed a moment ago but is gone now", self.stream)
            return {"stream": self.stream, "subject": subject, "partitions": partitions, "created": False}
        if info.subject != subject:
            raise LiftbridgeAirflowError(
                f"stream {self.stream!r} already exists on subject {info.subject!r}, not {subject!r}; "
                "delete it first or use its subject"
            )
        if len(info.partitions) != max(partitions, 1):
            self.log.warning(
                "Stream %r already exists with %d partition(s), not %d: keeping it as it is",
                self.stream,
                len(info.partitions),
                max(partitions, 1),
            )
        else:
            self.log.info("Stream %r already exists: nothing to do", self.stream)
        return {"stream": self.stream, "subject": info.subject, "partitions": len(info.partitions), "created": False}


class LiftbridgeDeleteStreamOperator(LiftbridgeBaseOperator):
    """Delete a stream and its data.

    :param stream: the stream's name. (templated)
    :param fail_if_missing: raise when there is no such stream (default: log and go on).
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "deleted"}``.
    :raises NoSuchStreamError: there is no such stream and ``fail_if_missing`` is set.
    """

    argument_checks = {"fail_if_missing": check_bool}

    def __init__(self, *, stream: str, fail_if_missing: bool = False, **kwargs: Any) -> None:
        super().__init__(stream=stream, **kwargs)
        self.fail_if_missing = fail_if_missing

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        try:
            client.delete_stream(self.stream)
        except NoSuchStreamError:
            if self.fail_if_missing:
                raise
            self.log.info("Stream %r does not exist: nothing to delete", self.stream)
            return {"stream": self.stream, "deleted": False}
        self.log.info("Deleted stream %r", self.stream)
        return {"stream": self.stream, "deleted": True}


class LiftbridgePauseStreamOperator(LiftbridgeBaseOperator):
    """Pause partitions of a stream (a paused partition holds no resources until a publish to it,
    or a subscription asking to resume, resumes it).

    :param stream: the stream's name. (templated)
    :param partitions: partitions to pause (default: all). (templated)
    :param resume_all: a publish to any paused partition resumes all of them.
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "partitions", "resume_all"}`` (``partitions`` null for all).
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: no such stream or partition.
    """

    template_fields: Sequence[str] = ("stream", "partitions", "liftbridge_conn_id")
    argument_checks = {"partitions": check_partition_list, "resume_all": check_bool}

    def __init__(
        self, *, stream: str, partitions: Sequence[int] | None = None, resume_all: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.partitions = partitions
        self.resume_all = resume_all

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        partitions = check_partition_list(self.partitions)
        with _missing_partitions_named(client, self.stream, partitions):
            client.pause_stream(self.stream, partitions=partitions, resume_all=self.resume_all)
        self.log.info("Paused stream %r, partitions %s", self.stream, partitions or "all")
        return {"stream": self.stream, "partitions": partitions, "resume_all": self.resume_all}


class LiftbridgeSetStreamReadonlyOperator(LiftbridgeBaseOperator):
    """Make partitions of a stream read-only (or writable again with ``readonly=False``).

    :param stream: the stream's name. (templated)
    :param partitions: partitions to change (default: all). (templated)
    :param readonly: true to refuse further publishes, false to accept them again.
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "partitions", "readonly"}`` (``partitions`` null for all).
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: no such stream or partition.
    """

    template_fields: Sequence[str] = ("stream", "partitions", "liftbridge_conn_id")
    argument_checks = {"partitions": check_partition_list, "readonly": check_bool}

    def __init__(
        self, *, stream: str, partitions: Sequence[int] | None = None, readonly: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.partitions = partitions
        self.readonly = readonly

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        partitions = check_partition_list(self.partitions)
        with _missing_partitions_named(client, self.stream, partitions):
            client.set_stream_readonly(self.stream, partitions=partitions, readonly=self.readonly)
        self.log.info(
            "Stream %r, partitions %s: %s",
            self.stream,
            partitions or "all",
            "read-only" if self.readonly else "writable",
        )
        return {"stream": self.stream, "partitions": partitions, "readonly": self.readonly}
