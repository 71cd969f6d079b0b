"""Publish a DataFrame to a Liftbridge stream as a Spark job (for ``spark-submit`` / ``SparkSubmitOperator``).

``spark-submit`` takes a file, not a module name: give it this module's file
(:func:`application_path`, or ``python -c "import airflow_provider_liftbridge.spark.submit as m;
print(m.__file__)"``)::

    spark-submit --master local[2] /path/to/airflow_provider_liftbridge/spark/submit.py \\
        --stream orders --brokers lb1:9292 --input s3a://bucket/orders/ --format parquet --key-col order_id

``python -m airflow_provider_liftbridge.spark.submit ...`` runs the same job on ``--master``
(default ``local[*]``).

Prints the summary as one JSON line on stdout; exits 1 with the error on stderr when anything was
not published (the message names the stream partition and what happened), 2 on bad arguments.
Connection settings default to ``LIFTBRIDGE_BROKERS`` / ``LIFTBRIDGE_NATS_SERVERS`` from the
environment, so they can stay out of the command line. NATS TLS and credentials: the ``--nats-*``
options; the password and token come only from ``LIFTBRIDGE_NATS_PASSWORD`` /
``LIFTBRIDGE_NATS_TOKEN`` (a command line is visible to every user of the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from airflow_provider_liftbridge.client import (
    AckPolicy,
    ConnectionSettings,
    InvalidArgumentError,
    PublishOptions,
    TlsConfig,
)
from airflow_provider_liftbridge.nats_security import NatsSecurity, NatsSecurityError

# Absolute imports: spark-submit runs this file as a script, outside its package.
from airflow_provider_liftbridge.spark.errors import LiftbridgeSparkError
from airflow_provider_liftbridge.spark.publish import publish_dataframe
from airflow_provider_liftbridge.spark.session import spark_session_scope
from airflow_provider_liftbridge.spark.sources import DataFrameSource


def application_path() -> str:
    """This file's path: the ``application`` to give ``spark-submit`` / ``SparkSubmitOperator``."""
    return os.path.abspath(__file__)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def nats_security_of(args: argparse.Namespace) -> NatsSecurity | None:
    """The NATS TLS and credentials of the command line (password and token from the environment).

    :raises NatsSecurityError: an incomplete or contradictory set (the message names the field).
    """
    values = {
        "tls": args.nats_tls,
        "tls_ca_file": args.nats_tls_ca_file,
        "tls_cert_file": args.nats_tls_cert_file,
        "tls_key_file": args.nats_tls_key_file,
        "tls_server_name": args.nats_tls_server_name,
        "user": args.nats_user,
        "password": os.environ.get("LIFTBRIDGE_NATS_PASSWORD") or None,
        "token": os.environ.get("LIFTBRIDGE_NATS_TOKEN") or None,
        "nkey_seed_file": args.nats_nkey_seed_file,
        "credentials_file": args.nats_credentials_file,
    }
    return NatsSecurity(**values) if any(values.values()) else None


def build_parser() -> argparse.ArgumentParser:
    """The command line of the job."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_liftbridge.spark.submit",
        description="Publish a DataFrame (a path, a table, a SQL query or a callable) to a Liftbridge stream.",
    )
    parser.add_argument("--stream", required=True, help="target stream (must exist)")
    conn = parser.add_argument_group("connection")
    conn.add_argument("--brokers", default=os.environ.get("LIFTBRIDGE_BROKERS"), help="host:port[,host:port...]")
    conn.add_argument("--nats-servers", default=os.environ.get("LIFTBRIDGE_NATS_SERVERS", ""), help="nats://h:p,...")
    conn.add_argument("--nats-tls", action="store_true", help="NATS over TLS (on by itself with a NATS TLS file)")
    for name in ("tls-ca-file", "tls-cert-file", "tls-key-file", "tls-server-name", "user"):
        conn.add_argument(f"--nats-{name}")
    conn.add_argument("--nats-nkey-seed-file", help="NKEY user seed file (needs the nkeys package)")
    conn.add_argument("--nats-credentials-file", help="NATS .creds file (needs the nkeys package)")
    conn.add_argument("--tls-ca-file")
    conn.add_argument("--tls-cert-file")
    conn.add_argument("--tls-key-file")
    conn.add_argument("--tls-server-name")
    conn.add_argument("--timeout", type=float, default=10.0, help="per-call deadline, seconds")
    source = parser.add_argument_group("source (exactly one)")
    source.add_argument("--input", help="path to read")
    source.add_argument("--format", default="parquet", help="Spark format of --input (default parquet)")
    source.add_argument("--read-option", action="append", type=_key_value, default=[], help="KEY=VALUE, repeatable")
    source.add_argument("--table")
    source.add_argument("--sql")
    source.add_argument("--callable", help="dotted path of f(spark) -> DataFrame")
    publish = parser.add_argument_group("publishing")
    publish.add_argument("--key-field")
    publish.add_argument("--value-col")
    publish.add_argument("--value-format", choices=("bytes", "text", "json"))
    publish.add_argument("--header-col", action="append", default=[], help="repeatable")
    publish.add_argument("--partitioner", help="key, round_robin, or an integer column")
    publish.add_argument("--ack-policy", default="leader", choices=("leader", "all", "none"))
    publish.add_argument("--window", type=int, default=256)
    publish.add_argument("--publish-timeout", type=float)
    spark = parser.add_argument_group("spark")
    spark.add_argument("--master", help="Spark master when not run by spark-submit (default local[*])")
    spark.add_argument("--conf", action="append", type=_key_value, default=[], help="spark KEY=VALUE, repeatable")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.brokers:
        parser.error("--brokers is required (or set LIFTBRIDGE_BROKERS)")
    try:
        tls_files = (args.tls_ca_file, args.tls_cert_file, args.tls_key_file, args.tls_server_name)
        settings = ConnectionSettings(
            brokers=args.brokers,
            nats_servers=args.nats_servers or (),
            tls=TlsConfig(*tls_files) if any(tls_files) else None,
            timeout=args.timeout,
            nats_security=nats_security_of(args),
        )
        options = PublishOptions(
            ack_policy=AckPolicy[args.ack_policy.upper()], window=args.window, timeout=args.publish_timeout
        )
        source = DataFrameSource(
            input_path=args.input,
            input_format=args.format,
            read_options=dict(args.read_option),
            table=args.table,
            sql=args.sql,
            dataframe_callable=args.callable,
        )
    except (LiftbridgeSparkError, InvalidArgumentError, NatsSecurityError) as exc:
        parser.error(str(exc))
    # Under spark-submit the master comes from its own arguments (the gateway variables are set).
    master = args.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]")
    try:
        with spark_session_scope(master, app_name=f"liftbridge-publish-{args.stream}", config=dict(args.conf)) as spark:
            summary = publish_dataframe(
                source.load(spark),
                args.stream,
                settings=settings,
                key_field=args.key_field,
                value_col=args.value_col,
                value_format=args.value_format,
                header_cols=args.header_col,
                partitioner=args.partitioner,
                options=options,
            )
    except LiftbridgeSparkError as exc:
        print(f"liftbridge publish failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
