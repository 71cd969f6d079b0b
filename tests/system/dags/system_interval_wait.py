"""A DAG of the system tier for the deferrable wait of an interval read: one
``LiftbridgeConsumeOperator`` with ``read=DataInterval(...)`` and ``deferrable=True``, reading the
interval ``[params.start_time, params.end_time)`` of the stream ``params.stream`` (all three given
by the test in the run's conf, with real timestamps a few seconds ahead). A run started before its
interval is complete defers once: ``LiftbridgeIntervalTrigger`` sleeps in the triggerer until a
committed message at or after the end, or the end plus the lateness, says the interval is
final, then fires (tests/system/test_interval_wait.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.operators import DataInterval
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator

#: The DAG's allowed lateness, seconds: generous beside the test's live stream (whose first message
#: after the end completes the interval first), small beside the test's budget.
ALLOWED_LATENESS = 15


def log_message(message: Message) -> None:
    """The per-message function: one log line per message read (the test reads them back)."""
    print(f"interval message: partition {message.partition} offset {message.offset} value {message.value!r}")


@dag(
    dag_id="system_interval_wait",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"stream": "system-interval", "start_time": "", "end_time": ""},
)
def system_interval_wait() -> None:
    LiftbridgeConsumeOperator(
        task_id="read_interval",
        stream="{{ params.stream }}",
        read=DataInterval(
            lateness=ALLOWED_LATENESS, start_time="{{ params.start_time }}", end_time="{{ params.end_time }}"
        ),
        deferrable=True,
        apply_function=log_message,
        retries=1,  # as the examples: a retry after apache/airflow#72716 re-checks and reads the interval
        retry_delay=timedelta(seconds=5),
    )


system_interval_wait()
