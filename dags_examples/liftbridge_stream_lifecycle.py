"""A stream's whole life in one DAG: create it, publish records, wait (deferred) until they are
committed, wait for a particular message, pause the stream, delete it.

Runs against any Liftbridge cluster, or the dev server (``liftbridge-devserver``), through the
``liftbridge_default`` connection, e.g.::

    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292}'
    airflow dags test liftbridge_stream_lifecycle

Each run uses its own stream (named after the run id) unless the ``stream`` param names one.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.stream import (
    LiftbridgeCreateStreamOperator,
    LiftbridgeDeleteStreamOperator,
    LiftbridgePauseStreamOperator,
)
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor


def stream_safe(text: str) -> str:
    """Make a run id usable as a stream name and NATS subject (letters, digits, ``-``, ``_``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


ORDERS = [
    {"order": 1, "status": "pending"},
    {"order": 2, "status": "pending"},
    {"order": 3, "status": "ready"},
    {"order": 4, "status": "pending"},
]


@dag(
    dag_id="liftbridge_stream_lifecycle",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"stream": ""},
    user_defined_filters={"stream_safe": stream_safe},
    tags=["liftbridge", "example"],
)
def liftbridge_stream_lifecycle() -> None:
    stream = "{{ params.stream or ('lifecycle-' ~ (run_id | stream_safe)) }}"

    create = LiftbridgeCreateStreamOperator(task_id="create_stream", stream=stream, partitions=1)
    publish = LiftbridgePublishOperator(task_id="publish_records", stream=stream, records=ORDERS, key_field="order")
    # Deferred (unless already committed): the worker slot is free while the triggerer waits.
    # retries: a sensor Airflow 3.3.2 kills right after it resumed from deferral (apache/airflow#72716)
    # is retried, and the retry finds its target reached at once (docs/airflow.md, Troubleshooting).
    committed = LiftbridgeOffsetSensor(
        task_id="wait_for_offset",
        stream=stream,
        target_offset=publish.output,
        deferrable=True,
        timeout=120,
        retries=1,
        retry_delay=timedelta(seconds=5),
    )
    ready = LiftbridgeMessageSensor(
        task_id="find_ready_order",
        stream=stream,
        apply_function="airflow_provider_liftbridge.sensors.matchers.json_field_equals",
        apply_function_args=["status", "ready"],
        start_at="earliest",
        deferrable=True,
        timeout=120,
        retries=1,
        retry_delay=timedelta(seconds=5),
    )
    pause = LiftbridgePauseStreamOperator(task_id="pause_stream", stream=stream)
    delete = LiftbridgeDeleteStreamOperator(task_id="delete_stream", stream=stream)

    create >> publish >> committed >> ready >> pause >> delete.as_teardown(setups=create)


liftbridge_stream_lifecycle()
