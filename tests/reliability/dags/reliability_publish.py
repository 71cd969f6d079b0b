"""The DAG of the task-kill scenario: one exactly-once publish (retried once), one task that
reports the publish summary. Configured through ``EO_*`` environment variables
(tests/reliability/scenarios.py)."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, task

from airflow_provider_liftbridge.client import PublishOptions
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator

with DAG(
    "liftbridge_reliability_publish",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
):
    publish = LiftbridgePublishOperator(
        task_id="publish",
        stream=os.environ.get("EO_STREAM", "reliability"),
        records_callable="tests.reliability.dag_support.records",
        records_callable_kwargs={"n": int(os.environ.get("EO_RECORDS", "100"))},
        exactly_once=True,
        batch_size=200,
        options=PublishOptions(path="grpc"),
        retries=1,
        retry_delay=dt.timedelta(seconds=0),
    )

    @task
    def report(summary: dict) -> dict:  # type: ignore[type-arg]
        return summary

    report(publish.output)
