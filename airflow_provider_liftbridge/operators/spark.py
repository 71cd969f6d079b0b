"""``LiftbridgeSparkPublishOperator``: build a DataFrame with Spark and publish it from the executors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseHook, Context

from airflow_provider_liftbridge.client import PublishOptions
from airflow_provider_liftbridge.client.write_stats import summary_line
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin, file_dataset
from airflow_provider_liftbridge.operators.base import LiftbridgeBaseOperator, producer_id_of
from airflow_provider_liftbridge.operators.publishing_base import PUBLISHING_CHECKS, warn_deprecated_options
from airflow_provider_liftbridge.spark.errors import SparkOptionError
from airflow_provider_liftbridge.spark.plan import PublishPlan
from airflow_provider_liftbridge.spark.session import DEFAULT_MASTER
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from airflow_provider_liftbridge.validation import bad_argument, check_function_path, optional

from .links import LiftbridgeStreamLink

__all__ = ["LiftbridgeSparkPublishOperator", "spark_settings_from_connection"]

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


class LiftbridgeSparkPublishOperator(LiftbridgeLineageMixin, LiftbridgeBaseOperator):
    """Build a DataFrame with Spark and publish every row to a stream from the executors.

    The DataFrame comes from exactly one of ``input_path`` (+ ``input_format``), ``table``, ``sql``
    or ``dataframe_callable``. Rows are published by the executors, each Spark partition with its
    own client; the driver only gathers one small summary per Spark partition. The task fails if
    any row is not acknowledged (the error names the stream partition and what happened); rows
    acknowledged before the failure stay in the stream.

    :param stream: target stream; it must exist. (templated)
    :param input_path: file or folder to read. (templated)
    :param input_format: Spark format of ``input_path`` (default ``parquet``). (templated)
    :param read_options: reader options, e.g. ``{"header": "true"}``. (templated)
    :param table: a table or view to publish. (templated)
    :param sql: a Spark SQL query whose result is published. (templated)
    :param dataframe_callable: dotted path of ``f(spark, **callable_kwargs) -> DataFrame``, checked for
        its shape when the DAG is parsed and imported on the worker (the Spark driver) when the task
        starts, before Spark does. (templated)
    :param callable_kwargs: keyword arguments of ``dataframe_callable``. (templated)
    :param key_col: column holding message keys. (templated)
    :param value_col: column holding message values; without it each row is published as JSON. (templated)
    :param value_format: ``"json"`` or ``"raw"`` (binary/string column); see ``docs/spark.md``.
    :param header_cols: columns published as message headers. (templated)
    :param partitioning: ``"key"``, ``"round_robin"`` or an integer column; defaults to ``"key"``
        when ``key_col`` is set, else ``"round_robin"``. (templated)
    :param ack_policy: ``"leader"``, ``"all"`` or ``"none"``; default: that of ``options``, else
        the connection's.
    :param options: how the executors publish, a
        :class:`~airflow_provider_liftbridge.client.PublishOptions` (serialised to every Spark
        task): its ``window`` (messages in flight per executor; default 256), ``timeout`` (seconds
        to wait for each batch's acks; default: the connection's), ``compression`` (see below),
        ``path`` (``"auto"``, ``"grpc"``, ``"nats"``) and ``ack_policy`` (where ``ack_policy`` is
        unset). Rows are placed by ``partitioning`` and never re-sent blindly, so its
        ``partition``, ``partitioner`` and ``resend`` are refused. The one home of the transport's
        tuning, as on the other publishing operators: the keywords below that did it are deprecated.
    :param window: deprecated, use ``options=PublishOptions(window=...)`` (still works, with an
        ``AirflowProviderDeprecationWarning``; it wins over ``options``).
    :param publish_timeout: deprecated, use ``options=PublishOptions(timeout=...)`` (as above).
    :param exactly_once: publish exactly once across retries of the task; each Spark partition is a
        producer ``<producer_id>/spark-<n>``, so the DataFrame's partitioning must be deterministic
        (see docs/exactly-once.md).
    :param producer_id: the producer id for ``exactly_once`` (default ``dag_id/task_id/run_id[/map_index]``).
        (templated)
    :param compression: deprecated, use ``options=PublishOptions(compression=...)`` (as above).
        ``"gzip"`` or ``"zstd"``: compress values on the executors, marked by a
        ``content-encoding`` header (the ``liftbridge`` data source reads them back decompressed).
        The XCom summary also has ``write_stats``: ack latencies (publish -> leader, publish ->
        commit; p50/p99/max ms) and throughput of all executors together, logged in one line.
    :param liftbridge_conn_id: the ``liftbridge`` connection. (templated)
    :param spark_conn_id: a ``spark`` or ``spark_connect`` connection; ``None`` runs on ``local[*]``. (templated)
    :param spark_config: Spark settings applied last (``{"spark.executor.memory": "2g"}``). (templated)
    :returns: (XCom) ``{"stream", "count", "acknowledged", "ack_policy", "partitions": {"0":
        {"first_offset", "last_offset", "count"}}, "bytes", "seconds", "spark_partitions"}``.
    :raises SparkOptionError: bad arguments (at construction) or columns (at run time).
    :raises LiftbridgeArgumentError: a bad publishing option (when the DAG is parsed for a literal
        value, once templates are rendered for a templated one).
    :raises LiftbridgeArgumentError: ``dataframe_callable`` has not the shape of a dotted path (at
        construction), or cannot be imported on the worker (when the task starts).
    :raises SparkStreamError: the stream does not exist.
    :raises SparkPublishError: rows were not acknowledged.
    """

    template_fields: Sequence[str] = (
        "stream",
        "liftbridge_conn_id",
        "input_path",
        "input_format",
        "read_options",
        "table",
        "sql",
        "dataframe_callable",
        "callable_kwargs",
        "key_col",
        "value_col",
        "header_cols",
        "partitioning",
        "spark_conn_id",
        "spark_config",
        "producer_id",
    )
    template_fields_renderers = {"sql": "sql", "read_options": "json", "spark_config": "json"}
    #: The publishing options it shares with the publishing operators, checked by the same validators.
    argument_checks = {
        **{
            name: PUBLISHING_CHECKS[name]
            for name in (
                "ack_policy",
                "options",
                "window",
                "publish_timeout",
                "exactly_once",
                "producer_id",
                "compression",
            )
        },
        "dataframe_callable": optional(check_function_path),
    }
    function_arguments = ("dataframe_callable",)
    ui_color = "#fde8d7"
    #: Buttons on the task instance page that open the Liftbridge view (docs/ui.md).
    operator_extra_links = (LiftbridgeStreamLink(),)

    def __init__(
        self,
        *,
        stream: str,
        input_path: str | None = None,
        input_format: str = "parquet",
        read_options: Mapping[str, str] | None = None,
        table: str | None = None,
        sql: str | None = None,
        dataframe_callable: str | None = None,
        callable_kwargs: Mapping[str, Any] | None = None,
        key_col: str | None = None,
        value_col: str | None = None,
        value_format: str | None = None,
        header_cols: Sequence[str] = (),
        partitioning: str | None = None,
        ack_policy: str | None = None,
        options: PublishOptions | None = None,
        window: int | None = None,
        publish_timeout: float | None = None,
        spark_conn_id: str | None = None,
        spark_config: Mapping[str, str] | None = None,
        exactly_once: bool = False,
        producer_id: str | None = None,
        compression: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        warn_deprecated_options(
            window=(window, "window"),
            publish_timeout=(publish_timeout, "timeout"),
            compression=(compression, "compression"),
        )
        #: How the executors publish (``None``: every option at its default), see the class.
        self.options = options
        self.input_path = input_path
        self.input_format = input_format
        self.read_options = dict(read_options or {})
        self.table = table
        self.sql = sql
        self.dataframe_callable = dataframe_callable
        self.callable_kwargs = dict(callable_kwargs or {})
        self.key_col = key_col
        self.value_col = value_col
        self.value_format = value_format
        self.header_cols = list(header_cols)
        self.partitioning = partitioning
        self.ack_policy = ack_policy
        self.window = window
        self.publish_timeout = publish_timeout
        self.spark_conn_id = spark_conn_id
        self.spark_config = dict(spark_config or {})
        self.exactly_once = exactly_once
        self.producer_id = producer_id
        self.compression = compression
        # Fail when the DAG is parsed, not when the task runs: one source, and options that make sense.
        self._source()
        if "{{" not in stream:
            # The publishing options are checked by argument_checks; the plan checks the rest.
            PublishPlan(
                stream=stream,
                value_format=value_format,  # type: ignore[arg-type]
                value_col=value_col,
                key_col=key_col,
                header_cols=tuple(header_cols),
                partitioning=partitioning,
            )

    def _source(self) -> DataFrameSource:
        return DataFrameSource(
            input_path=self.input_path,
            input_format=self.input_format,
            read_options=self.read_options,
            table=self.table,
            sql=self.sql,
            dataframe_callable=self.dataframe_callable,
            callable_kwargs=self.callable_kwargs,
        )

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads ``input_path`` (tables, SQL and callables are not reported), writes the stream."""
        inputs = [file_dataset(self.input_path)] if self.input_path else []
        return inputs, [self.lineage_stream(self.stream)]

    def check_combination(self, *, rendered: bool) -> None:
        """``options`` leaves placement and re-sending to the plan: its ``partition``,
        ``partitioner`` and ``resend`` are refused rather than ignored."""
        super().check_combination(rendered=rendered)
        options = self.options
        if not isinstance(options, PublishOptions):
            return  # not one yet: its own check names it
        for field, fix in (
            ("partition", "use partitioning=<an integer column>"),
            ("partitioner", "use partitioning='key' or 'round_robin'"),
            ("resend", "the executors never re-send blindly (exactly_once=True for retries without duplicates)"),
        ):
            if getattr(options, field) is not None:
                raise bad_argument(
                    "options", options, f"the Spark operator places rows itself and takes no options.{field}", fix
                )

    def publish_options(self) -> PublishOptions:
        """How the executors publish: ``options``, with the operator's own keywords (rendered,
        checked by the publishing operators' validators) where they are set; ``None`` leaves the
        connection's ack policy and timeout and the plan's window (256).

        :raises LiftbridgeArgumentError: an option is invalid (names it and the fix).
        """
        checks = self.all_argument_checks()
        base = checks["options"](self.options, "options") or PublishOptions()
        ack_policy = None if self.ack_policy == "" else checks["ack_policy"](self.ack_policy, "ack_policy")
        window = checks["window"](self.window, "window")
        timeout = checks["publish_timeout"](self.publish_timeout, "publish_timeout")
        compression = checks["compression"](self.compression, "compression") if self.compression else None
        return base.replace(
            ack_policy=base.ack_policy if ack_policy is None else ack_policy,
            window=base.window if window is None else window,
            timeout=base.timeout if timeout is None else timeout,
            compression=base.compression if compression is None else compression,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_liftbridge.spark.publish import publish_dataframe
        from airflow_provider_liftbridge.spark.session import spark_session_scope

        self.import_functions()  # a missing dataframe_callable module fails before Spark starts
        settings = self.hook.settings
        master, config = spark_settings_from_connection(self.spark_conn_id) if self.spark_conn_id else (None, {})
        config.update(self.spark_config)
        with spark_session_scope(
            master or config.pop("spark.master", DEFAULT_MASTER),
            app_name=f"{self.dag_id}-{self.task_id}",
            config=config,
        ) as spark:
            summary = publish_dataframe(
                self._source().load(spark),
                self.stream,
                settings=settings,
                key_col=self.key_col,
                value_col=self.value_col,
                value_format=self.value_format,  # type: ignore[arg-type]
                header_cols=self.header_cols,
                partitioning=self.partitioning,
                options=self.publish_options(),
                exactly_once=self.exactly_once,
                producer_id=producer_id_of(context, self.producer_id) if self.exactly_once else None,
            )
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
