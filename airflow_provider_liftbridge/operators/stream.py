"""Stream administration: create, delete, pause, make read-only.

Forgiving by default where repeating an action is harmless: creating a stream that exists and
deleting one that does not are logged, not fatal (``fail_if_exists`` / ``fail_if_missing`` make
them fatal). Each operator returns a small JSON-safe dict describing what it did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import Context

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    NoSuchPartitionError,
    NoSuchStreamError,
    StreamExistsError,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError
from airflow_provider_liftbridge.validation import (
    Check,
    check_bool,
    check_duration,
    check_name,
    check_non_negative_int,
    check_partition_count,
    check_partition_list,
    check_positive_int,
    check_replication_factor,
    check_subject,
    optional,
)

from .base import LiftbridgeBaseOperator

__all__ = [
    "LiftbridgeCreateStreamOperator",
    "LiftbridgeDeleteStreamOperator",
    "LiftbridgePauseStreamOperator",
    "LiftbridgeSetStreamReadonlyOperator",
]

#: Stream options passed to ``create_stream`` as they are.
_PLAIN_OPTIONS = (
    "group",
    "retention_max_bytes",
    "retention_max_messages",
    "segment_max_bytes",
    "compact_enabled",
    "compact_max_goroutines",
    "auto_pause_disable_if_subscribers",
    "min_isr",
    "optimistic_concurrency_control",
    "encryption",
)
#: Stream options that are durations: a ``timedelta`` or a number of seconds.
_DURATION_OPTIONS = ("retention_max_age", "cleaner_interval", "segment_max_age", "auto_pause_time")
_CREATE_CHECKS: dict[str, Check] = {
    "subject": check_subject,
    "partitions": check_partition_count,
    "replication_factor": check_replication_factor,
    "group": optional(check_name),
    "retention_max_bytes": optional(check_non_negative_int),
    "retention_max_messages": optional(check_non_negative_int),
    "segment_max_bytes": optional(check_non_negative_int),
    "compact_max_goroutines": optional(check_positive_int),
    "min_isr": optional(check_positive_int),
    "fail_if_exists": check_bool,
    **{name: check_duration for name in _DURATION_OPTIONS},
    **{
        name: optional(check_bool)
        for name in (
            "compact_enabled",
            "auto_pause_disable_if_subscribers",
            "optimistic_concurrency_control",
            "encryption",
        )
    },
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
    :param partitions: number of partitions (partition N listens on ``subject.N``; 0 means 1, as
        on Liftbridge). (templated)
    :param replication_factor: copies of each partition (``-1``: every broker). ``0`` is taken as
        ``1``, as Liftbridge does (0 is "not set" on its API); more than the cluster's brokers is
        refused by the server when the task runs.
    :param group: NATS queue group name.
    :param retention_max_bytes: / :param retention_max_messages: / :param retention_max_age:
        retention limits (age as ``timedelta`` or seconds).
    :param cleaner_interval: how often retention is enforced (``timedelta`` or seconds).
    :param segment_max_bytes: / :param segment_max_age: when to roll log segments.
    :param compact_enabled: / :param compact_max_goroutines: log compaction.
    :param auto_pause_time: pause partitions idle for this long (``timedelta`` or seconds).
    :param auto_pause_disable_if_subscribers: do not auto-pause partitions with subscribers.
    :param min_isr: minimum in-sync replicas for ack policy ALL.
    :param optimistic_concurrency_control: refuse publishes whose expected offset is wrong.
    :param encryption: encrypt data at rest.
    :param fail_if_exists: raise when the stream already exists (default: log and go on).
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: ``{"stream", "subject", "partitions", "created"}``; ``created`` is false when it existed.
    :raises StreamExistsError: the stream exists and ``fail_if_exists`` is set.
    :raises LiftbridgeAirflowError: the stream exists with another subject.
    :raises LiftbridgeArgumentError: an invalid argument (when the DAG is parsed for literal values).
    """

    template_fields: Sequence[str] = ("stream", "subject", "partitions", "liftbridge_conn_id")
    argument_checks = _CREATE_CHECKS

    def __init__(
        self,
        *,
        stream: str,
        subject: str | None = None,
        partitions: int = 1,
        replication_factor: int = 1,
        group: str | None = None,
        retention_max_bytes: int | None = None,
        retention_max_messages: int | None = None,
        retention_max_age: timedelta | float | None = None,
        cleaner_interval: timedelta | float | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age: timedelta | float | None = None,
        compact_enabled: bool | None = None,
        compact_max_goroutines: int | None = None,
        auto_pause_time: timedelta | float | None = None,
        auto_pause_disable_if_subscribers: bool | None = None,
        min_isr: int | None = None,
        optimistic_concurrency_control: bool | None = None,
        encryption: bool | None = None,
        fail_if_exists: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.subject = subject
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.group = group
        self.retention_max_bytes = retention_max_bytes
        self.retention_max_messages = retention_max_messages
        self.retention_max_age = retention_max_age
        self.cleaner_interval = cleaner_interval
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_age = segment_max_age
        self.compact_enabled = compact_enabled
        self.compact_max_goroutines = compact_max_goroutines
        self.auto_pause_time = auto_pause_time
        self.auto_pause_disable_if_subscribers = auto_pause_disable_if_subscribers
        self.min_isr = min_isr
        self.optimistic_concurrency_control = optimistic_concurrency_control
        self.encryption = encryption
        self.fail_if_exists = fail_if_exists
        self.check_literal_arguments(LiftbridgeCreateStreamOperator)

    def stream_options(self) -> dict[str, Any]:
        """The keyword arguments of ``create_stream`` this operator passes (unset ones left out)."""
        options: dict[str, Any] = {name: getattr(self, name) for name in _PLAIN_OPTIONS}
        options.update({name: check_duration(getattr(self, name), name) for name in _DURATION_OPTIONS})
        return {name: value for name, value in options.items() if value is not None}

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        subject = self.subject or self.stream
        partitions = check_partition_count(self.partitions)
        replication_factor = check_replication_factor(self.replication_factor) or 1  # 0: Liftbridge's 1
        try:
            client.create_stream(
                subject,
                self.stream,
                partitions=partitions,
                replication_factor=replication_factor,
                **self.stream_options(),
            )
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
        self.check_literal_arguments(LiftbridgeDeleteStreamOperator)

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
        self.check_literal_arguments(LiftbridgePauseStreamOperator)

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
        self.check_literal_arguments(LiftbridgeSetStreamReadonlyOperator)

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
