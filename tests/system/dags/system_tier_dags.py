"""DAGs of the system-test tier (tests/system), parsed beside the example DAGs.

* ``system_burst_consumer``: scheduled on an asset watched by ``LiftbridgeEventTrigger`` on the
  ``system-burst`` stream, with one ``EmptyOperator`` (the scheduler finishes it without a worker),
  so thousands of asset events cost no task processes: it measures the watcher, not the workers.
* ``system_wait_for_message``: one deferrable ``LiftbridgeMessageSensor`` that waits for the value
  ``go`` on the stream named by the ``stream`` param; it stays DEFERRED in the triggerer until then.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Asset, AssetWatcher, dag

from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger

BURST_STREAM = "system-burst"

burst_orders = Asset(
    name="system_burst_orders",
    watchers=[
        AssetWatcher(
            name="system_burst_watcher",
            trigger=LiftbridgeEventTrigger(
                stream=BURST_STREAM,
                apply_function="airflow_provider_liftbridge.sensors.matchers.json_field_equals",
                apply_function_args=["status", "ready"],
                cursor_id="system-burst",
                start_at="earliest",
                poll_interval=1,
            ),
        )
    ],
)


@dag(dag_id="system_burst_consumer", schedule=[burst_orders], start_date=datetime(2024, 1, 1), catchup=False)
def system_burst_consumer() -> None:
    EmptyOperator(task_id="noted")


@dag(
    dag_id="system_wait_for_message",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"stream": "system-wait"},
)
def system_wait_for_message() -> None:
    LiftbridgeMessageSensor(
        task_id="wait_for_go",
        stream="{{ params.stream }}",
        apply_function="airflow_provider_liftbridge.sensors.matchers.value_contains",
        apply_function_args=["go"],
        start_at="earliest",
        deferrable=True,
        timeout=600,
        retries=1,  # as the examples: a retry after apache/airflow#72716 re-checks and finishes
        retry_delay=timedelta(seconds=5),
    )


system_burst_consumer()
system_wait_for_message()
