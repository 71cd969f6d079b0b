"""``LiftbridgePublishOperator``: publish records given inline, from XCom, or made by a callable."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from airflow.sdk import Context, get_current_context
from airflow.sdk.module_loading import import_string

from airflow_provider_liftbridge.client import AckPolicy, ConnectionSettings, LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import (
    ExactlyOncePublisher,
    ExactlyOncePublishError,
    ExactlyOnceResult,
)
from airflow_provider_liftbridge.hooks.connection import parse_ack_policy
from airflow_provider_liftbridge.hooks.exceptions import LiftbridgeArgumentError, LiftbridgePublishNotAcknowledgedError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.nats_security import redact_urls

from .base import LiftbridgeBaseOperator, producer_id_of
from .publishing import (
    PUBLISH_PATHS,
    BatchSender,
    PartitionRange,
    PublishSummary,
    build_record,
    make_partitioner,
    open_sender,
    publish_in_windows,
)

#: Cap of unacknowledged records in flight, whatever the window.
MAX_IN_FLIGHT = 1024

__all__ = ["LiftbridgePublishOperator", "LiftbridgePublishingMixin"]


class LiftbridgePublishingMixin:
    """Options shared by the operators that publish records: key, headers, partitioning, acks.

    Holds their validation and the call to :func:`publish_in_windows`, so each operator only says
    where its records come from.
    """

    stream: str
    key: Any
    headers: Mapping[str, Any] | None
    partition: int | str | None
    partitioner: str | None
    ack_policy: str | int | AckPolicy | None
    window: int
    publish_timeout: float | None
    publish_path: str
    exactly_once: bool
    producer_id: str | None

    def _init_publishing(
        self,
        *,
        key: str | bytes | None,
        headers: Mapping[str, Any] | None,
        partition: int | None,
        partitioner: str | None,
        ack_policy: str | int | AckPolicy | None,
        window: int,
        publish_timeout: float | None,
        publish_path: str,
        exactly_once: bool = False,
        producer_id: str | None = None,
    ) -> None:
        if publish_path not in PUBLISH_PATHS:
            raise LiftbridgeArgumentError(
                f"publish_path {publish_path!r} is unknown; use one of {', '.join(PUBLISH_PATHS)}"
            )
        self.publish_path = publish_path
        self.key = key
        self.headers = headers
        self.partition = partition
        self.partitioner = partitioner
        self.ack_policy = ack_policy
        self.window = window
        self.publish_timeout = publish_timeout
        self.exactly_once = bool(exactly_once)
        self.producer_id = producer_id
        self._eo: tuple[BatchSender, ExactlyOncePublisher] | None = None
        make_partitioner(partitioner)  # fail at DAG parse time on a bad name

    def resolved_ack_policy(self, default: AckPolicy) -> AckPolicy:
        """The ack policy to publish with: the operator's, else the connection's default.

        :raises LiftbridgeArgumentError: the operator's value names no ack policy.
        """
        if self.ack_policy is None or self.ack_policy == "":
            return default
        try:
            return parse_ack_policy(self.ack_policy)
        except ValueError as exc:
            raise LiftbridgeArgumentError(str(exc)) from None

    def open_publisher(self, client: LiftbridgeClient, settings: ConnectionSettings) -> BatchSender:
        """Open the sender for this operator's options (close it, or use it as a context manager).

        The path is ``publish_path``: ``"auto"`` takes NATS-direct when the connection lists NATS
        servers (the bulk path of ADR 1), else gRPC PublishAsync; the choice is logged.
        """
        # A templated partition renders to a string; an empty one means "not set".
        raw: Any = self.partition
        partition = None if raw is None or raw == "" else int(raw)
        sender = open_sender(
            client,
            self.stream,
            path=self.publish_path,
            nats_servers=settings.nats_servers,
            ack_policy=self.resolved_ack_policy(settings.ack_policy),
            window=min(int(self.window), MAX_IN_FLIGHT),
            partition=partition,
            partitioner=make_partitioner(self.partitioner),
            timeout=self.publish_timeout if self.publish_timeout is not None else settings.timeout,
        )
        self.log.info(  # type: ignore[attr-defined]
            "Publishing to stream %r over %s (ack policy %s)",
            self.stream,
            f"NATS ({redact_urls(settings.nats_servers)})" if sender.path == "nats" else "gRPC PublishAsync",
            sender.ack_policy.name,
        )
        if sender.fallback_reason:
            self.log.warning("%s", sender.fallback_reason)  # type: ignore[attr-defined]
        return sender

    def publish(
        self,
        sender: BatchSender,
        records: Iterable[Any],
        *,
        on_window: Callable[[PublishSummary], None] | None = None,
    ) -> PublishSummary:
        """Publish ``records`` through ``sender`` in windows of ``window`` records; return the summary.

        With ``exactly_once`` the records go through one
        :class:`~airflow_provider_liftbridge.client.exactly_once.ExactlyOncePublisher` per sender (so
        sequence numbers run on across calls, e.g. across files) on the sender's path.
        """
        if not self.exactly_once:
            return publish_in_windows(sender, records, window=int(self.window), on_window=on_window)
        if self._eo is None or self._eo[0] is not sender:
            self._eo = (sender, self._exactly_once_publisher(sender))
        publisher = self._eo[1]
        first_call = publisher.total.count == 0
        try:
            result = publisher.publish(records)
        except ExactlyOncePublishError as exc:
            raise LiftbridgePublishNotAcknowledgedError(self.stream, exc.result.count, str(exc)) from exc
        summary = _summary_of(result, sender.ack_policy, publisher.found if first_call else {})
        if on_window is not None:
            on_window(summary)
        return summary

    def _exactly_once_publisher(self, sender: BatchSender) -> ExactlyOncePublisher:
        producer_id = self.producer_id or producer_id_of(get_current_context())
        self.log.info(  # type: ignore[attr-defined]
            "Exactly-once publishing to stream %r as producer %r", self.stream, producer_id
        )
        return ExactlyOncePublisher(
            sender.client,
            self.stream,
            producer_id,
            partition=sender.partition,
            partitioner=sender.partitioner,
            ack_policy=sender.ack_policy,
            batch=int(self.window),
            window=sender.window,
            timeout=float(sender.timeout if sender.timeout is not None else self.hook.settings.timeout),  # type: ignore[attr-defined]
            nats_servers=self.hook.settings.nats_servers if sender.path == "nats" else (),  # type: ignore[attr-defined]
        )


def _summary_of(result: ExactlyOnceResult, ack_policy: AckPolicy, found: Any) -> PublishSummary:
    """The operator summary of an exactly-once publish: every record is in the stream (written now
    or skipped as written before); offsets of earlier tries' records come from the resume scan."""
    summary = PublishSummary(
        result.stream,
        ack_policy,
        count=result.count,
        acknowledged=result.count,
        producer_id=result.producer_id,
        written=result.written,
        skipped=result.skipped,
    )
    for partition, span in [*result.partitions.items(), *found.items()]:
        if span.count == 0:
            continue
        mine = PartitionRange(span.first_offset, span.last_offset, span.count)
        if partition in summary.partitions:
            summary.partitions[partition].merge(mine)
        else:
            summary.partitions[partition] = mine
    return summary


class LiftbridgePublishOperator(LiftbridgeLineageMixin, LiftbridgePublishingMixin, LiftbridgeBaseOperator):
    """Publish records to a stream and fail unless every one is acknowledged.

    Records come from exactly one of:

    - ``records``: a list given inline, rendered by Jinja, or an ``XComArg`` (``task.output``); a
      string is parsed as a JSON list (so ``"{{ ti.xcom_pull('t') | tojson }}"`` works);
    - ``records_callable``: the dotted path of a function returning an iterable of records,
      imported where the task runs (so the DAG serializes cleanly).

    Each record is ``bytes`` (published as it is), ``str`` (UTF-8), a
    :class:`~airflow_provider_liftbridge.client.Record` (full control), or any other JSON value
    (published as compact JSON).

    :param stream: the stream to publish to. (templated)
    :param records: the records, see above. (templated)
    :param records_callable: dotted path of a function returning records. (templated)
    :param records_callable_args: / :param records_callable_kwargs: its arguments. (templated)
    :param key: the key of every record. (templated)
    :param key_field: for mapping records, the field whose value is the key. (templated)
    :param headers: headers of every record (str or bytes values). (templated)
    :param partition: publish every record to this partition. (templated)
    :param partitioner: ``"key"`` (CRC-32 of the key, like the Go client) or ``"round_robin"``;
        unset: partition 0 unless ``partition`` is set.
    :param ack_policy: ``"leader"``, ``"all"`` or ``"none"`` (default: the connection's). With
        ``"none"`` nothing is acknowledged and the summary has no offsets.
    :param window: records published (and acknowledged) per batch.
    :param publish_timeout: how long to wait for each ack, seconds (default: the connection's timeout).
    :param publish_path: ``"auto"`` (NATS-direct when the connection lists NATS servers, else gRPC),
        ``"grpc"`` or ``"nats"``.
    :param exactly_once: publish exactly once across retries of the task (see docs/exactly-once.md;
        needs cursors enabled on the cluster, else ``CursorsDisabledError`` at once):
        every record carries the producer id and its position in ``records``, and a retry skips
        what an earlier try already put in the stream. The records must be the same, in the same
        order, on every try.
    :param producer_id: the producer id for ``exactly_once`` (default ``dag_id/task_id/run_id[/map_index]``).
    :param liftbridge_conn_id: the connection to use. (templated)
    :return: the publish summary, ``{"stream", "count", "acknowledged", "ack_policy",
        "partitions": {"<n>": {"first_offset", "last_offset", "count"}}}``; with ``exactly_once``
        also ``"producer_id"``, ``"written"`` and ``"skipped"``.
    :raises LiftbridgePublishNotAcknowledgedError: a record was not acknowledged or was refused.
    :raises LiftbridgeArgumentError: no records source, or two of them, or a record cannot be encoded.
    """

    template_fields: Sequence[str] = (
        "stream",
        "records",
        "records_callable",
        "records_callable_args",
        "records_callable_kwargs",
        "key",
        "key_field",
        "headers",
        "partition",
        "liftbridge_conn_id",
        "producer_id",
    )
    template_fields_renderers = {"records": "json", "headers": "json"}

    def __init__(
        self,
        *,
        stream: str,
        records: Any = None,
        records_callable: str | None = None,
        records_callable_args: Sequence[Any] | None = None,
        records_callable_kwargs: Mapping[str, Any] | None = None,
        key: str | bytes | None = None,
        key_field: str | None = None,
        headers: Mapping[str, Any] | None = None,
        partition: int | None = None,
        partitioner: str | None = None,
        ack_policy: str | None = None,
        window: int = 1000,
        publish_timeout: float | None = None,
        publish_path: str = "auto",
        exactly_once: bool = False,
        producer_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        if (records is None) == (records_callable is None):
            raise LiftbridgeArgumentError("give exactly one of records and records_callable")
        if records_callable is not None and not isinstance(records_callable, str):
            raise LiftbridgeArgumentError(
                f"records_callable must be a dotted path such as 'my_pkg.make_records', got {records_callable!r}"
            )
        self.records = records
        self.records_callable = records_callable
        self.records_callable_args = records_callable_args
        self.records_callable_kwargs = records_callable_kwargs
        self.key_field = key_field
        self._init_publishing(
            key=key,
            headers=headers,
            partition=partition,
            partitioner=partitioner,
            ack_policy=ack_policy,
            window=window,
            publish_timeout=publish_timeout,
            publish_path=publish_path,
            exactly_once=exactly_once,
            producer_id=producer_id,
        )

    def source_records(self) -> Iterable[Any]:
        """The records to publish, from ``records`` or ``records_callable``.

        :raises LiftbridgeArgumentError: the source does not give a list/iterable of records.
        """
        if self.records_callable is not None:
            try:
                func = import_string(self.records_callable)
            except ImportError as exc:
                raise LiftbridgeArgumentError(f"records_callable {self.records_callable!r}: {exc}") from None
            produced = func(*(self.records_callable_args or ()), **(self.records_callable_kwargs or {}))
            if produced is None or isinstance(produced, str | bytes | Mapping):
                raise LiftbridgeArgumentError(
                    f"records_callable {self.records_callable!r} must return an iterable of records, "
                    f"got {type(produced).__name__}"
                )
            return produced  # type: ignore[no-any-return]
        records = self.records
        if isinstance(records, str):
            try:
                records = json.loads(records)
            except json.JSONDecodeError as exc:
                raise LiftbridgeArgumentError(f"records is a string but not a JSON list: {exc}") from None
        if isinstance(records, Mapping) or not isinstance(records, Iterable) or isinstance(records, bytes):
            raise LiftbridgeArgumentError(f"records must be a list of records, got {type(records).__name__}")
        return records

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: writes the stream."""
        return [], [self.lineage_stream(self.stream)]

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        records = (
            build_record(item, key=self.key, key_field=self.key_field, headers=self.headers)
            for item in self.source_records()
        )
        with self.open_publisher(client, self.hook.settings) as sender:
            summary = self.publish(sender, records)
        self.log.info(
            "Published %d record(s) to stream %r (%d acknowledged, ack policy %s)",
            summary.count,
            self.stream,
            summary.acknowledged,
            summary.ack_policy.name,
        )
        if summary.count == 0:
            self.log.warning("There were no records to publish")
        return summary.to_xcom()
