"""``LiftbridgePublishingOperator``: the base of the operators that publish records.

It holds the options they share (key, headers, partition, partitioner, batch size, the transport's
options value, exactly-once),
validates them, opens the client's batch publisher and publishes through it, so each operator
only says where its records come from (:meth:`LiftbridgePublishingOperator.source_records`) and,
when it publishes in parts (files), how it reports them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow.sdk import Context, get_current_context

from airflow_provider_liftbridge.client import (
    AckPolicy,
    BatchPublisher,
    ConnectionSettings,
    LiftbridgeClient,
    PublishError,
    PublishOptions,
    PublishSummary,
    Record,
)
from airflow_provider_liftbridge.client.exactly_once import (
    ExactlyOncePublisher,
    ExactlyOncePublishError,
    ExactlyOnceResult,
    ReplacedHistoryError,
)
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.client.publishing.summary import PartitionRange
from airflow_provider_liftbridge.exceptions import (
    LiftbridgeArgumentError,
    LiftbridgePublishNotAcknowledgedError,
    LiftbridgeReplacedHistoryError,
)
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.nats_security import redact_urls
from airflow_provider_liftbridge.spark.errors import SparkPublishError
from airflow_provider_liftbridge.validation import (
    Check,
    bad_argument,
    check_bool,
    check_choice,
    check_headers,
    check_key,
    check_optional_name,
    check_optional_partition,
    check_positive_int,
    optional,
)

from .base import LiftbridgeBaseOperator, producer_id_of
from .links import LiftbridgeStreamLink
from .records import PARTITIONERS, make_partitioner

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MAX_IN_FLIGHT",
    "PUBLISHING_CHECKS",
    "REMOVED_PUBLISHING_ARGUMENTS",
    "LiftbridgePublishingOperator",
    "check_exactly_once_acks",
    "check_options_argument",
    "refuse_option_fields",
    "replaced_history_failure",
]

#: Cap of unacknowledged records in flight (the client's window), whatever the batch size.
MAX_IN_FLIGHT = 1024
#: Records per batch, unless ``batch_size`` says otherwise.
DEFAULT_BATCH_SIZE = 1000


def check_options_argument(value: Any, name: str = "options") -> PublishOptions | None:
    """``None`` or a :class:`PublishOptions` (which checked its own values when it was made).

    :raises LiftbridgeArgumentError: anything else.
    """
    if value is None or isinstance(value, PublishOptions):
        return value
    raise bad_argument(name, value, "a PublishOptions value is required", f"e.g. {name}=PublishOptions(path='grpc')")


def check_exactly_once_acks(exactly_once: Any, options: Any) -> None:
    """Exactly-once needs acknowledgements: ``exactly_once=True`` with ``options`` whose
    ``ack_policy`` is ``NONE`` is refused (shared by every publishing operator, Spark's included).

    :raises LiftbridgeArgumentError: naming ``options`` and the fix.
    """
    if exactly_once is True and isinstance(options, PublishOptions) and options.ack_policy is AckPolicy.NONE:
        raise bad_argument(
            "options",
            options,
            "exactly_once=True needs acknowledgements to know what is in the stream",
            "use options=PublishOptions(ack_policy='all') (or 'leader'), or exactly_once=False",
        )


def refuse_option_fields(options: Any, **fixes: str) -> None:
    """Refuse the fields of ``options`` (a :class:`PublishOptions`) named in ``fixes`` when set:
    the operator says those itself, once (``fixes``: field -> what to write instead).

    :raises LiftbridgeArgumentError: naming ``options``, the field and the fix.
    """
    if not isinstance(options, PublishOptions):
        return  # not one yet: its own check names it
    for field, fix in fixes.items():
        if getattr(options, field) is not None:
            raise bad_argument("options", options, f"the operator says this itself, not options.{field}", f"use {fix}")


def replaced_history_failure(stream: str, producer_id: str, exc: Exception) -> LiftbridgeReplacedHistoryError | None:
    """The task's failure without Airflow's retries when ``exc`` says an exactly-once publish found
    a replaced history: a client ``ReplacedHistoryError``, or a ``SparkPublishError`` whose tasks
    raised one (``replaced_history``); ``None`` for any other failure, which the caller raises as a
    retryable error (shared by every publishing operator, Spark's included: ADR 8, rule 6).

    A retry would send again what the current leader lacks; where a replica kept the other history
    those records are then stored twice (seed 59919), so a human compares the replicas first.
    """
    if isinstance(exc, ReplacedHistoryError) or (isinstance(exc, SparkPublishError) and exc.replaced_history):
        return LiftbridgeReplacedHistoryError(stream, producer_id, f"{type(exc).__name__}: {exc}")
    return None


#: Keywords the publishing operators took before 0.1.0 was released, and what to write instead.
REMOVED_PUBLISHING_ARGUMENTS: dict[str, str] = {
    "window": "batch_size=N for records per batch (the records in flight are options=PublishOptions(window=N))",
    "publish_timeout": "options=PublishOptions(timeout=...)",
    "publish_path": "options=PublishOptions(path=...)",
    "compression": "options=PublishOptions(compression=...)",
    "ack_policy": "options=PublishOptions(ack_policy=...)",
}

#: The publishing options' validators (run when the DAG is parsed and after rendering).
PUBLISHING_CHECKS: dict[str, Check] = {
    "key": check_key,
    "headers": check_headers,
    "partition": check_optional_partition,
    "partitioner": optional(check_choice(PARTITIONERS)),
    "batch_size": check_positive_int,
    "options": check_options_argument,
    "exactly_once": check_bool,
    "producer_id": check_optional_name,
}


class LiftbridgePublishingOperator(LiftbridgeLineageMixin, LiftbridgeBaseOperator):
    """Publish records to a stream and fail unless every one is acknowledged; subclasses say
    where the records come from.

    :param stream: the stream to publish to. (templated)
    :param key: the key of every record: ``str`` (UTF-8), ``bytes``, or an ``int`` (its decimal
        digits); anything else is refused. (templated)
    :param headers: headers of every record: ``str`` names, values ``str``, ``bytes`` or ``int``
        (decimal digits); ``None`` or any other type is refused. (templated)
    :param partition: publish every record to this partition. (templated)
    :param partitioner: ``"key"`` (CRC-32 of the key, like the Go client) or ``"round_robin"``;
        unset: partition 0 unless ``partition`` is set.
    :param batch_size: records published (and acknowledged) per batch, 1 or more; bounds memory.
        At most ``min(batch_size, 1024)`` records are unacknowledged at a time (the client's
        window, :data:`MAX_IN_FLIGHT`) unless ``options`` sets its ``window``.
    :param options: how records travel, one
        :class:`~airflow_provider_liftbridge.client.PublishOptions` value shared by every
        publishing operator (the Spark operator's included): its ``path`` (``"auto"``:
        NATS-direct when the connection lists NATS servers, else gRPC; ``"grpc"``; ``"nats"``),
        ``ack_policy`` (``"leader"``, ``"all"`` or ``"none"``; default: the connection's; with
        ``"none"`` nothing is acknowledged and the summary has no offsets), ``timeout`` (seconds
        to wait for each ack; default: the connection's), ``compression`` (``"gzip"`` or
        ``"zstd"``: every value compressed before it is sent, marked by a ``content-encoding``
        header that this provider's readers undo), ``window`` (records in flight; default
        ``min(batch_size, 1024)``) and ``resend`` (unless ``exactly_once``). Where records go is
        this operator's ``partition`` and ``partitioner``: the options' own are refused.
    :param exactly_once: publish exactly once across retries of the task (see docs/exactly-once.md;
        needs cursors enabled on the cluster, else ``CursorsDisabledError`` at once):
        every record carries the producer id and its position in the input, and a retry skips
        what an earlier try already put in the stream. The input must be the same, in the same
        order, on every try. Needs acknowledgements: an ack policy ``"none"`` is refused with it.
        Combines with compression (a retry recognises records by their headers, not their values).
    :param producer_id: the producer id for ``exactly_once`` (default ``dag_id/task_id/run_id[/map_index]``).
    :param liftbridge_conn_id: the connection to use. (templated)
    :raises LiftbridgeArgumentError: an invalid option: when the DAG is parsed for a literal value,
        once templates are rendered for a templated one (the message names the option, the value
        and the fix).

    The XCom summary has ``write_stats`` (unless nothing is acknowledged): latencies from the acks,
    in milliseconds, from publish to leader reception and to commit (``p50``, ``p99``, ``max``), and
    the throughput (``records_per_second``, ``bytes_per_second`` of values as sent); the task log
    prints them in one line.
    """

    argument_checks = PUBLISHING_CHECKS
    removed_arguments = REMOVED_PUBLISHING_ARGUMENTS
    #: Buttons on the task instance page that open the Liftbridge view (docs/ui.md).
    operator_extra_links = (LiftbridgeStreamLink(),)

    def __init__(
        self,
        *,
        stream: str,
        key: str | bytes | None = None,
        headers: Mapping[str, Any] | None = None,
        partition: int | None = None,
        partitioner: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        options: PublishOptions | None = None,
        exactly_once: bool = False,
        producer_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        #: How records travel (``None``: every option at its default), see the class.
        self.options = options
        self.key = key
        self.headers = headers
        self.partition = partition
        self.partitioner = partitioner
        #: Records per batch.
        self.batch_size = batch_size
        self.exactly_once = exactly_once
        self.producer_id = producer_id
        # The exactly-once publisher wrapping each batch publisher, made when it first publishes.
        self._exactly_once: weakref.WeakKeyDictionary[BatchPublisher, ExactlyOncePublisher] = (
            weakref.WeakKeyDictionary()
        )

    def check_combination(self, *, rendered: bool) -> None:
        """Exactly-once needs acknowledgements (refused with an ack policy ``"none"``), and where
        records go is said once: by ``partition`` and ``partitioner``, not by ``options``."""
        super().check_combination(rendered=rendered)
        check_exactly_once_acks(self.exactly_once, self.options)
        refuse_option_fields(self.options, partition="partition=N", partitioner="partitioner='key'")

    # -- what subclasses say ------------------------------------------------------------------
    def source_records(self, context: Context) -> Iterable[Record]:
        """The records to publish, read lazily where the input is large."""
        raise NotImplementedError

    # -- publishing ---------------------------------------------------------------------------
    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        """Publish :meth:`source_records` and return the summary as XCom."""
        with self.open_publisher(client) as publisher:
            summary = self.send_records(publisher, self.source_records(context))
        self.log.info(
            "Published %d record(s) to stream %r (%d acknowledged, ack policy %s)",
            summary.count,
            self.stream,
            summary.acknowledged,
            summary.ack_policy.name,
        )
        if summary.count == 0:
            self.log.warning("There were no records to publish")
        return summary.to_dict() | self.write_stats(publisher)

    def write_stats(self, publisher: BatchPublisher) -> dict[str, Any]:
        """``{"write_stats": {...}}`` of what ``publisher`` sent, logged in one line (``{}`` when
        nothing was acknowledged, e.g. ack policy NONE). With ``exactly_once`` it covers what this try
        sent (the exactly-once publisher sends through ``publisher``)."""
        stats = publisher.stats
        if stats is None or not stats.acks:
            return {}
        self.log.info("Write statistics for stream %r: %s", self.stream, stats.log_line())
        return {"write_stats": stats.summary()}

    @property
    def _batch_size(self) -> int:
        return int(check_positive_int(self.batch_size, "batch_size"))

    def publish_options(self, settings: ConnectionSettings) -> PublishOptions:
        """This operator's options (rendered) as the one options value: ``options``, with the
        operator's own keywords where they are set (checked by the shared validators), the
        connection's ack policy and timeout where neither sets one. With ``exactly_once`` nothing
        is re-sent blindly (it decides itself what to send again, after reading the partition).

        :raises LiftbridgeArgumentError: an option is invalid (names it and the fix).
        """
        base = check_options_argument(self.options) or PublishOptions()
        partition = check_optional_partition(self.partition, "partition")  # a rendered "" is "not set"
        policy = settings.ack_policy if base.ack_policy is None else base.ack_policy
        return base.replace(
            partition=partition,
            partitioner=make_partitioner(self.partitioner),
            ack_policy=policy,
            window=base.window if base.window is not None else min(self._batch_size, MAX_IN_FLIGHT),
            timeout=base.timeout or settings.timeout,
            resend=NO_RESEND if self.exactly_once else base.resend,
        )

    def open_publisher(self, client: LiftbridgeClient) -> BatchPublisher:
        """The client's batch publisher for this operator's options; the path it takes is logged.
        With ``exactly_once`` it never re-sends (:meth:`send_records` wraps it for exactly-once).

        :raises LiftbridgeArgumentError: ``options=PublishOptions(path="nats")`` while the
            connection lists no NATS servers, or a bad partition.
        :raises NoSuchStreamError: the NATS path was chosen and the stream does not exist.
        """
        settings = self.hook.settings
        options = self.publish_options(settings)
        if options.path == "nats" and not settings.nats_servers:
            raise LiftbridgeArgumentError(
                "options=PublishOptions(path='nats') needs NATS servers: fill in the connection's 'NATS servers'"
            )
        publisher = client.batch_publisher(self.stream, options, write_stats=True)
        path = publisher.path
        self.log.info(
            "Publishing to stream %r over %s (ack policy %s%s)",
            self.stream,
            f"NATS ({redact_urls(settings.nats_servers)})" if path == "nats" else "gRPC PublishAsync",
            publisher.options.policy.name,
            f", {publisher.options.compression} compression" if publisher.options.compression else "",
        )
        if publisher.fallback_reason:
            self.log.warning(
                "The connection lists NATS servers, but this publish goes over gRPC: %s", publisher.fallback_reason
            )
        return publisher

    def send_records(
        self,
        publisher: BatchPublisher,
        records: Iterable[Record],
        *,
        on_progress: Callable[[PublishSummary], None] | None = None,
    ) -> PublishSummary:
        """Publish ``records`` through ``publisher`` ``batch_size`` at a time; return the summary.

        With ``exactly_once`` the records go through the
        :class:`~airflow_provider_liftbridge.client.exactly_once.ExactlyOncePublisher` wrapping
        ``publisher`` and the task's client (the hook's, the one :meth:`run` is given): made on the
        first call for ``publisher`` and kept, so sequence numbers run on across calls, e.g.
        across files.

        :raises LiftbridgePublishNotAcknowledgedError: a record was not acknowledged or was refused,
            or fewer records are accounted for than were read from the source.
        :raises LiftbridgeReplacedHistoryError: with ``exactly_once``, the stream's history was
            replaced (``ReplacedHistoryError``): the task fails without Airflow's retries.
        """
        if self.exactly_once:
            summary = self._send_exactly_once(publisher, records, on_progress)
        else:
            summary = PublishSummary(self.stream, publisher.options.policy)
            try:
                publisher.send_all(records, batch=self._batch_size, summary=summary, on_progress=on_progress)
            except PublishError as exc:
                raise LiftbridgePublishNotAcknowledgedError(self.stream, summary.acknowledged, str(exc)) from exc
        # ``count`` is what the publisher read from the source (exactly-once checks its own);
        # ``acknowledged`` only ever comes from the acks (with exactly-once: written or found written).
        if summary.ack_policy != AckPolicy.NONE and summary.acknowledged != summary.count:
            raise LiftbridgePublishNotAcknowledgedError(
                self.stream,
                summary.acknowledged,
                f"{summary.count} record(s) were read from the source but {summary.acknowledged} are accounted for; "
                "this is a bug of airflow-provider-liftbridge, please report it (the records may or may not be stored)",
            )
        return summary

    def _send_exactly_once(
        self,
        publisher: BatchPublisher,
        records: Iterable[Record],
        on_progress: Callable[[PublishSummary], None] | None,
    ) -> PublishSummary:
        eo = self._exactly_once.get(publisher)
        if eo is None:
            eo = self._exactly_once[publisher] = self._wrap_exactly_once(self.hook.client, publisher)
        first_call = eo.total.count == 0
        try:
            result = eo.publish(records)
        except ExactlyOncePublishError as exc:
            raise (
                replaced_history_failure(self.stream, eo.producer_id, exc)
                or LiftbridgePublishNotAcknowledgedError(self.stream, exc.result.count, str(exc))
            ) from exc
        summary = _summary_of(result, publisher.options.policy, eo.found if first_call else {})
        if on_progress is not None:
            on_progress(summary)
        return summary

    def _wrap_exactly_once(self, client: LiftbridgeClient, publisher: BatchPublisher) -> ExactlyOncePublisher:
        """Wrap ``publisher`` (opened without re-sends) and ``client`` for exactly-once publishing:
        no second publisher or client. A zombie try is waited for up to the task's
        ``execution_timeout`` when it has one."""
        producer_id = self.producer_id or producer_id_of(get_current_context())
        self.log.info("Exactly-once publishing to stream %r as producer %r", self.stream, producer_id)
        limit = self.execution_timeout.total_seconds() if self.execution_timeout else None
        waits = {"zombie_wait": limit} if limit and limit > 0 else {}
        return ExactlyOncePublisher.wrapping(client, publisher, producer_id, batch=self._batch_size, **waits)

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: writes the stream."""
        return [], [self.lineage_stream(self.stream)]


def _summary_of(result: ExactlyOnceResult, ack_policy: AckPolicy, found: Mapping[int, Any]) -> PublishSummary:
    """The summary of an exactly-once publish: every record is in the stream (written now or
    skipped as written before); offsets of earlier tries' records come from the resume scan."""
    summary = PublishSummary(
        result.stream,
        ack_policy,
        count=result.count,
        acknowledged=result.written + result.skipped,
        producer_id=result.producer_id,
        written=result.written,
        skipped=result.skipped,
    )
    for partition, span in [*result.partitions.items(), *found.items()]:
        if span.count:
            summary.add_range(partition, PartitionRange(span.first_offset, span.last_offset, span.count))
    return summary
