"""The three deferrable sensors in one DAG, for the check-before-deferring tests
(tests/sensors/test_deferral_dag.py). Run it with conf ``{"stream": ..., "summary": ...}``: the
stream has three partitions, one per sensor."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_provider_liftbridge.sensors.ack import LiftbridgeAckSensor
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor

with DAG(
    "liftbridge_sensor_deferral",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    render_template_as_native_obj=True,
):
    common = {"deferrable": True, "timeout": 60}  # dag.test() ignores the deferral timeout: tests bound the run
    LiftbridgeOffsetSensor(
        task_id="wait_offset", stream="{{ dag_run.conf['stream'] }}", partition=0, target_offset=2, **common
    )
    LiftbridgeAckSensor(task_id="wait_ack", publish_summary="{{ dag_run.conf['summary'] }}", **common)
    LiftbridgeMessageSensor(
        task_id="wait_message",
        stream="{{ dag_run.conf['stream'] }}",
        partition=2,
        apply_function="airflow_provider_liftbridge.sensors.matchers.value_contains",
        apply_function_args=["ready"],
        **common,
    )
