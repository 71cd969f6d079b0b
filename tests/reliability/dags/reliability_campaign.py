"""The DAGs of the fault campaign's operator paths (tests/reliability/campaign.py): the consume
operator with a batch function that notes every message it is handed, and the archiver writing
Parquet files; and both again reading by interval (``read=DataInterval(...)``, the interval
``[EO_INTERVAL_START, EO_INTERVAL_END)``, no allowed lateness; the archive into the folders of
``EO_INTERVAL_LAYOUT``). Each task is retried by Airflow within the one ``dag.test()`` run
(``EO_*`` environment variables)."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG

from airflow_provider_liftbridge.operators import DataInterval, SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

_START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)

with DAG("liftbridge_campaign_consume", schedule=None, start_date=_START, catchup=False):
    LiftbridgeConsumeOperator(
        task_id="consume",
        stream=os.environ.get("EO_STREAM", "campaign"),
        read=SinceLastRun("campaign-operator"),
        apply_function_batch="tests.reliability.dag_support.note_batch",
        batch_size=200,
        retries=3,
        retry_delay=dt.timedelta(seconds=1),
    )

with DAG("liftbridge_campaign_archive", schedule=None, start_date=_START, catchup=False):
    LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=os.environ.get("EO_STREAM", "campaign"),
        read=SinceLastRun("campaign-archive"),
        path=os.environ.get("EO_ARCHIVE", "/tmp/campaign-archive"),
        format="parquet",
        value_format="bytes",
        batch_size=500,
        retries=3,
        retry_delay=dt.timedelta(seconds=1),
    )

with DAG("liftbridge_campaign_consume_interval", schedule=None, start_date=_START, catchup=False):
    LiftbridgeConsumeOperator(
        task_id="consume",
        stream=os.environ.get("EO_STREAM", "campaign"),
        read=DataInterval(
            lateness=0,
            start_time=os.environ.get("EO_INTERVAL_START") or None,
            end_time=os.environ.get("EO_INTERVAL_END") or None,
            cursor_id="campaign-operator-interval",
        ),
        apply_function_batch="tests.reliability.dag_support.note_batch",
        batch_size=200,
        retries=3,
        retry_delay=dt.timedelta(seconds=1),
    )

with DAG("liftbridge_campaign_archive_interval", schedule=None, start_date=_START, catchup=False):
    LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=os.environ.get("EO_STREAM", "campaign"),
        read=DataInterval(
            lateness=0,
            start_time=os.environ.get("EO_INTERVAL_START") or None,
            end_time=os.environ.get("EO_INTERVAL_END") or None,
            cursor_id="campaign-archive-interval",
        ),
        path=os.environ.get("EO_ARCHIVE", "/tmp/campaign-archive"),
        format="parquet",
        value_format="bytes",
        batch_size=200,
        path_layout=os.environ.get("EO_INTERVAL_LAYOUT") or None,
        retries=3,
        retry_delay=dt.timedelta(seconds=1),
    )
