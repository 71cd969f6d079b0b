"""A consume task whose first try is SIGKILLed part-way (tests/operators/test_consume_operator.py);
configured by the ``CONSUME_*`` environment variables."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG

from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator

with DAG(
    "liftbridge_consume_killable", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), catchup=False
):
    LiftbridgeConsumeOperator(
        task_id="consume",
        stream=os.environ.get("CONSUME_STREAM", "killable"),
        read=SinceLastRun("killable"),
        apply_function="tests.operators.consume_support.record_to_file",
        batch_size=4,
        retries=1,
        retry_delay=dt.timedelta(seconds=0),
    )
