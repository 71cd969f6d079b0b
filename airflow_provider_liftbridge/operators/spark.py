"""``LiftbridgeSparkPublishOperator``: build a DataFrame with Spark and publish it from the executors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseHook, Context

from airflow_provider_liftbridge.client import PublishOptions
from airflow_provider_liftbridge.client.write_stats import summary_line
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin, file_dataset
from airflow_provider_liftbridge.operators.base import LiftbridgeBaseOperator, producer_id_of
from airflow_provider_liftbridge.operators.publishing_base import (
    PUBLISHING_CHECKS,
    REMOVED_PUBLISHING_ARGUMENTS,
    check_exactly_once_acks,
    check_options_argument,
    refuse_option_fields,
    replaced_history_failure,
)
from airflow_provider_liftbridge.spark.errors import SparkOptionError, SparkPublishError
from airflow_provider_liftbridge.spark.plan import PublishPlan
from airflow_provider_liftbridge.spark.session import DEFAULT_MASTER
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_function_path,
    import_function,
    waits_for_rendering,
)

from .links import LiftbridgeStreamLink

__all__ = [
    "DataFrameSource",  # the type of ``source``, for DAG files
    "LiftbridgeSparkPublishOperator",
    "check_source",
    "spark_settings_from_connection",
]

# Extras of the Spark provider's ``spark`` connection that map to Spark settings of an in-process session.
_SPARK_EXTRA_CONF = {"queue": "spark.yarn.queue", "namespace": "spark.kubernetes.namespace"}


def spark_settings_from_connection(conn_id: str) -> tuple[str, dict[str, str]]:
    """The Spark master URL and Spark settings of an Airflow ``spark`` or ``spark_connect`` connection.

    - ``spark``: ``host`` is the master (``local[2]``, ``spark://h``, ``yarn``, ``k8s://...`` or
      ``sc://h`` for Spark Connect), ``port`` is appended when set; extras named ``spark.*`` are
      Spark settings, ``queue`` and ``namespace`` map to their YARN / Kubernetes settings.
    - ``spark_connect``: the Spark Connect URL the Spark provider builds (``sc://host:port/;...``).

    :raises SparkOptionError: the connection has no host.
    """
    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type == "spark_connect":
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return SparkConnectHook(conn_id).get_connection_url(), {}
    host = (conn.host or "").strip()
    if not host:
        raise SparkOptionError(f"Spark connection {conn_id!r} has no host: set it to local[*], a master URL or sc://")
    master = f"{host}:{conn.port}" if conn.port and not host.startswith("local") else host
    config: dict[str, str] = {}
    for key, value in (conn.extra_dejson or {}).items():
        if key.startswith("spark."):
            config[key] = str(value)
        elif key in _SPARK_EXTRA_CONF and value:
            config[_SPARK_EXTRA_CONF[key]] = str(value)
    return master, config


#: The Spark operator's keywords before 0.1.0 was released, and what to write instead.
_REMOVED_SPARK_ARGUMENTS: dict[str, str] = {
    "key_col": "key_field=<the key column>",
    "partitioning": "partitioner=... ('key', 'round_robin' or an integer column)",
    "window": "options=PublishOptions(window=...) (records in flight per executor)",
    **{name: REMOVED_PUBLISHING_ARGUMENTS[name] for name in ("publish_timeout", "compression", "ack_policy")},
    **{name: f"source=DataFrameSource({name}=...)" for name in DataFrameSource.template_fields},
}


def check_source(value: Any, name: str = "source") -> DataFrameSource:
    """A :class:`~airflow_provider_liftbridge.spark.sources.DataFrameSource` (whose callable, if it
    names one, has the shape of a dotted path).

    :raises LiftbridgeArgumentError: anything else.
    """
    if not isinstance(value, DataFrameSource):
        raise bad_argument(name, value, "a DataFrameSource is required", f"e.g. {name}=DataFrameSource(table='orders')")
    if value.dataframe_callable is not None and not waits_for_rendering(value.dataframe_callable):
        check_function_path(value.dataframe_callable, "source.dataframe_callable")
    return value


class LiftbridgeSparkPublishOperator(LiftbridgeLineageMixin, LiftbridgeBaseOperator):
    """Build a DataFrame with Spark and publish every row to a stream from the executors.

    The DataFrame comes from ``source``, one
    :class:`~airflow_provider_liftbridge.spark.sources.DataFrameSource`: a path (+ format and
    reader options), a table, a SQL query or a callable. Rows are published by the executors,
    each Spark partition with its own client; the driver only gathers one small summary per Spark
    partition. The task fails if any row is not acknowledged (the error names the stream partition
    and what happened); rows acknowledged before the failure stay in the stream.

    :param stream: target stream; it must exist. (templated)
    :param source: where the DataFrame comes from: ``DataFrameSource(input_path=...,
        input_format=..., read_options=...)``, ``DataFrameSource(table=...)``,
        ``DataFrameSource(sql=...)`` or ``DataFrameSource(dataframe_callable="pkg.mod.f",
        callable_kwargs={...})`` (``f(spark, **callable_kwargs) -> DataFrame``, checked for its
        shape when the DAG is parsed and imported on the worker, the Spark driver, when the task
        starts, before Spark does). Its fields are templated.
    :param key_field: column holding message keys. (templated)
    :param value_col: column holding message values; without it each row is published as JSON. (templated)
    :param value_format: ``"bytes"`` (a binary column, or a string column as UTF-8), ``"text"``
        (the column's string form, UTF-8) or ``"json"``; see ``docs/spark.md``.
    :param header_cols: columns published as message headers. (templated)
    :param partitioner: ``"key"``, ``"round_robin"`` or an integer column; defaults to ``"key"``
        when ``key_field`` is set, else ``"round_robin"``. (templated)
    :param options: how the executors publish, the one
        :class:`~airflow_provider_liftbridge.client.PublishOptions` value of every publishing
        operator (serialised to every Spark task): its ``ack_policy`` (default: the connection's),
        ``window`` (records in flight per executor; default 256), ``timeout`` (seconds to wait for
        each batch's acks; default: the connection's), ``compression`` (``"gzip"`` or ``"zstd"``:
        values compressed on the executors, marked by a ``content-encoding`` header that the
        ``liftbridge`` data source undoes) and ``path`` (``"auto"``, ``"grpc"``, ``"nats"``).
        Rows are placed by ``partitioner`` and never re-sent blindly, so its ``partition``,
        ``partitioner`` and ``resend`` are refused.
    :param exactly_once: publish exactly once across retries of the task; each Spark partition is a
        producer ``<producer_id>/spark-<n>``, so the DataFrame's partitioning must be deterministic
        (see docs/exactly-once.md).
    :param producer_id: the producer id for ``exactly_once`` (default ``dag_id/task_id/run_id[/map_index]``).
        (templated)
    :param liftbridge_conn_id: the ``liftbridge`` connection. (templated)
    :param spark_conn_id: a ``spark`` or ``spark_connect`` connection; ``None`` runs on ``local[*]``. (templated)
    :param spark_config: Spark settings applied last (``{"spark.executor.memory": "2g"}``). (templated)
    :returns: (XCom) ``{"stream", "count", "acknowledged", "ack_policy", "partitions": {"0":
        {"first_offset", "last_offset", "count"}}, "bytes", "seconds", "spark_partitions"}``, with
        ``write_stats`` (ack latencies publish -> leader and publish -> commit, p50/p99/max ms, and
        the throughput of all executors together, also logged in one line) unless nothing was
        acknowledged.
    :raises SparkOptionError: bad arguments (at construction) or columns (at run time).
    :raises LiftbridgeArgumentError: a bad publishing option or source (when the DAG is parsed for
        a literal value, once templates are rendered for a templated one), or a
        ``dataframe_callable`` that cannot be imported on the worker (when the task starts).
    :raises SparkStreamError: the stream does not exist.
    :raises SparkPublishError: rows were not acknowledged (Airflow retries the task).
    :raises LiftbridgeReplacedHistoryError: with ``exactly_once``, a task found the stream's history
        replaced: the task fails without Airflow's retries (docs/exactly-once.md).
    """

    template_fields: Sequence[str] = (
        "stream",
        "liftbridge_conn_id",
        "source",
        "key_field",
        "value_col",
        "header_cols",
        "partitioner",
        "spark_conn_id",
        "spark_config",
        "producer_id",
    )
    template_fields_renderers = {"spark_config": "json"}
    #: The publishing options it shares with the publishing operators, checked by the same validators.
    argument_checks = {
        **{name: PUBLISHING_CHECKS[name] for name in ("options", "exactly_once", "producer_id")},
        "source": check_source,
    }
    removed_arguments = _REMOVED_SPARK_ARGUMENTS
    ui_color = "#fde8d7"
    #: Buttons on the task instance page that open the Liftbridge view (docs/ui.md).
    operator_extra_links = (LiftbridgeStreamLink(),)

    def __init__(
        self,
        *,
        stream: str,
        source: DataFrameSource | None = None,
        key_field: str | None = None,
        value_col: str | None = None,
        value_format: str | None = None,
        header_cols: Sequence[str] = (),
        partitioner: str | None = None,
        options: PublishOptions | None = None,
        spark_conn_id: str | None = None,
        spark_config: Mapping[str, str] | None = None,
        exactly_once: bool = False,
        producer_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)  # refuses a removed keyword first, naming the new form
        if source is None:
            raise LiftbridgeArgumentError(
                "source is required: e.g. source=DataFrameSource(table='orders'), (input_path=...), (sql=...) "
                "or (dataframe_callable=...)"
            )
        #: How the executors publish (``None``: every option at its default), see the class.
        self.options = options
        self.source: DataFrameSource = source
        self.key_field = key_field
        self.value_col = value_col
        self.value_format = value_format
        self.header_cols = list(header_cols)
        self.partitioner = partitioner
        self.spark_conn_id = spark_conn_id
        self.spark_config = dict(spark_config or {})
        self.exactly_once = exactly_once
        self.producer_id = producer_id
        # Fail when the DAG is parsed, not when the task runs: options that make sense together.
        if "{{" not in stream:
            # The publishing options are checked by argument_checks; the plan checks the rest.
            PublishPlan(
                stream=stream,
                value_format=value_format,  # type: ignore[arg-type]
                value_col=value_col,
                key_field=key_field,
                header_cols=tuple(header_cols),
                partitioner=partitioner,
            )

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the source's ``input_path`` (tables, SQL and callables are not
        reported), writes the stream."""
        path = self.source.input_path if isinstance(self.source, DataFrameSource) else None
        return ([file_dataset(path)] if path else []), [self.lineage_stream(self.stream)]

    def check_combination(self, *, rendered: bool) -> None:
        """``options`` leaves placement and re-sending to the plan: its ``partition``,
        ``partitioner`` and ``resend`` are refused rather than ignored; exactly-once needs acks."""
        super().check_combination(rendered=rendered)
        check_exactly_once_acks(self.exactly_once, self.options)
        refuse_option_fields(
            self.options,
            partition="partitioner=<an integer column>",
            partitioner="partitioner='key' or 'round_robin'",
            resend="no resend: the executors never re-send blindly (exactly_once=True for retries without duplicates)",
        )

    def publish_options(self) -> PublishOptions:
        """How the executors publish: ``options`` (rendered, checked); ``None`` leaves the
        connection's ack policy and timeout and the plan's window (256).

        :raises LiftbridgeArgumentError: ``options`` is not a ``PublishOptions``.
        """
        return check_options_argument(self.options, "options") or PublishOptions()

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_liftbridge.spark.publish import publish_dataframe
        from airflow_provider_liftbridge.spark.session import spark_session_scope

        if self.source.dataframe_callable:
            # A missing module fails before Spark starts, on this worker (the Spark driver).
            import_function(self.source.dataframe_callable, "source.dataframe_callable")
        settings = self.hook.settings
        master, config = spark_settings_from_connection(self.spark_conn_id) if self.spark_conn_id else (None, {})
        config.update(self.spark_config)
        with spark_session_scope(
            master or config.pop("spark.master", DEFAULT_MASTER),
            app_name=f"{self.dag_id}-{self.task_id}",
            config=config,
        ) as spark:
            producer_id = producer_id_of(context, self.producer_id) if self.exactly_once else None
            try:
                summary = publish_dataframe(
                    self.source.load(spark),
                    self.stream,
                    settings=settings,
                    key_field=self.key_field,
                    value_col=self.value_col,
                    value_format=self.value_format,  # type: ignore[arg-type]
                    header_cols=self.header_cols,
                    partitioner=self.partitioner,
                    options=self.publish_options(),
                    exactly_once=self.exactly_once,
                    producer_id=producer_id,
                )
            except SparkPublishError as exc:
                failure = replaced_history_failure(self.stream, producer_id, exc) if producer_id else None
                if failure is not None:
                    raise failure from exc
                raise
        self.log.info(
            "Published %d row(s) (%d bytes) to stream %s over %s from %d Spark partition(s) in %.1f s (%.0f rows/s)",
            summary.count - summary.skipped,
            summary.bytes,
            summary.stream,
            "NATS-direct envelopes" if settings.nats_servers else "gRPC PublishAsync",
            summary.extra["spark_partitions"],
            summary.seconds,
            summary.rate,
        )
        stats = summary.extra.get("write_stats")
        if stats:
            self.log.info("Write statistics for stream %r: %s", self.stream, summary_line(stats))
        return summary.to_dict()
