"""A DAG of the system tier for the Liftbridge view's actions (tests/system/test_ui_actions.py):
one ``LiftbridgeConsumeOperator`` reading :data:`STREAM` since its last run, as JSON, sending
what is not JSON to ``<stream>-dlq``. The test replays those dead letters and moves the task's
cursor in the view, then triggers another run and checks what it read."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream

#: The stream read (the test creates it).
STREAM = "system-ui-actions"


def log_message(message: Message) -> None:
    """One log line per message processed (the test reads them back)."""
    print(f"actions message: partition {message.partition} offset {message.offset}")


@dag(
    dag_id="system_ui_actions",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
)
def system_ui_actions() -> None:
    LiftbridgeConsumeOperator(
        task_id="consume",
        stream=STREAM,
        read=SinceLastRun(f"{STREAM}-cursor"),
        value_format="json",
        apply_function=log_message,
        dead_letters=DeadLetterStream(f"{STREAM}-dlq", create=True),
    )


system_ui_actions()
