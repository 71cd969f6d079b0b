"""Stream administration: create, delete, pause, make read-only.

Forgiving by default where repeating an action is harmless: creating a stream that exists and
deleting one that does not are logged, not fatal (``fail_if_exists`` / ``fail_if_missing`` make
them fatal). Each operator returns a small JSON-safe dict describing what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    NoSuchPartitionError,
    NoSuchStreamError,
    StreamExistsError,
    StreamOptions,
)
from airflow_provider_liftbridge.client.checks import check_duration
from airflow_provider_liftbridge.client.stream_options import STREAM_OPTION_NAMES
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError
from airflow_provider_liftbridge.validation import (
    Check,
    airflow_check,
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

_CREATE_CHECKS: dict[str, Check] = {
    "subject": check_subject,
    "fail_if_exists": check_bool,
    # One per stream option, the option's own (client/stream_options.py), as Airflow's error.
    **{name: airflow_check(check) for name, check in StreamOptions.keyword_checks().items()},
}


def _stream_option_keywords(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, which takes the stream options through ``**kwargs``, with a signature that names
    each of them (from ``StreamOptions``, where they are declared once): Airflow reads it for
    ``default_args`` and for ``partial()`` / ``expand()``, the unknown-keyword check and
    ``help()`` for the parameters."""
    signature = inspect.signature(init)
    *named, rest = signature.parameters.values()
    seconds = StreamOptions.keyword_checks()
    options = [
        inspect.Parameter(
            each.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=each.default,
            # A duration is given as a timedelta or seconds (its keyword check reads both).
            annotation="timedelta | float | None" if seconds[each.name] is check_duration else each.type,
        )
        for each in dataclasses.fields(StreamOptions)
    ]
    init.__signature__ = signature.replace(parameters=[*named, *options, rest])  # type: ignore[attr-defined]
    return init


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
    :param options: a :class:`~airflow_provider_liftbridge.client.StreamOptions`: how the stream is
        made (default: the server's defaults, 1 partition, 1 copy).
    :param partitions: / :param replication_factor: / ... every field of ``StreamOptions`` is also a
        keyword of this operator (it replaces that field of ``options``), with the same meaning;
        durations as ``timedelta`` or seconds. ``partitions`` is templated. ``replication_factor=0``
        is taken as ``1``, as Liftbridge does (0 is "not set" on its API); more than the cluster's
        brokers is refused by the server when the task runs.
    :param fail_if_exists: raise when the stream already exists (default: log and go on).
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "subject", "partitions", "created"}``; ``created`` is false when it existed.
    :raises StreamExistsError: the stream exists and ``fail_if_exists`` is set.
    :raises LiftbridgeAirflowError: the stream exists with another subject.
    :raises LiftbridgeArgumentError: an invalid argument (when the DAG is parsed for literal values).
    """

    template_fields: Sequence[str] = ("stream", "subject", "partitions", "liftbridge_conn_id")
    argument_checks = _CREATE_CHECKS

    @_stream_option_keywords
    def __init__(
        self,
        *,
        stream: str,
        subject: str | None = None,
        options: StreamOptions | None = None,
        fail_if_exists: bool = False,
        **kwargs: Any,
    ) -> None:
        given = options if options is not None else StreamOptions()
        chosen = {name: kwargs.pop(name, getattr(given, name)) for name in STREAM_OPTION_NAMES}
        super().__init__(stream=stream, **kwargs)
        self.subject = subject
        for name, value in chosen.items():  # one attribute per option: ``partitions`` is templated
            setattr(self, name, value)
        self.fail_if_exists = fail_if_exists

    def create_options(self) -> StreamOptions:
        """The stream options of this task, from its (rendered) attributes.

        :raises InvalidArgumentError: a bad value (the checks already ran when it was rendered).
        """
        options = StreamOptions.from_keywords({name: getattr(self, name) for name in STREAM_OPTION_NAMES})
        return options.replace(replication_factor=options.replication_factor or 1)  # 0: Liftbridge's 1

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
