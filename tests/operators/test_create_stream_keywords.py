"""``LiftbridgeCreateStreamOperator`` takes every field of ``StreamOptions`` as a keyword, as
Airflow sees keywords: in its signature (``default_args``, ``partial``/``expand``), checked when
the DAG is parsed, and as one ``options`` value."""

from __future__ import annotations

import datetime as dt
import inspect
from datetime import timedelta

import pytest

from airflow_provider_liftbridge.client import StreamOptions
from airflow_provider_liftbridge.client.stream_options import STREAM_OPTION_NAMES
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator


def test_the_signature_names_every_stream_option() -> None:
    params = inspect.signature(LiftbridgeCreateStreamOperator).parameters
    assert set(STREAM_OPTION_NAMES) <= set(params)
    assert params["partitions"].default == 1 and params["retention_max_age"].default is None


def test_default_args_and_partial_expand_reach_the_options() -> None:
    from airflow.sdk import DAG

    with DAG("d", schedule=None, start_date=dt.datetime(2024, 1, 1), default_args={"partitions": 4}):
        op = LiftbridgeCreateStreamOperator(task_id="c", stream="s")
        mapped = LiftbridgeCreateStreamOperator.partial(task_id="m", retention_max_age=60).expand(stream=["a", "b"])
    assert op.partitions == 4 and op.create_options().partitions == 4
    assert mapped.partial_kwargs["retention_max_age"] == 60


def test_options_value_and_keywords_combine() -> None:
    given = StreamOptions(partitions=3, compact_enabled=True)
    op = LiftbridgeCreateStreamOperator(task_id="c", stream="s", options=given, retention_max_age=3600)
    assert op.create_options() == given.replace(retention_max_age=timedelta(hours=1))
    assert op.stream_options() == {"partitions": 3, "compact_enabled": True, "retention_max_age": timedelta(hours=1)}


def test_an_unknown_keyword_names_the_option_meant() -> None:
    with pytest.raises(TypeError, match="did you mean 'partitions'"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", partition=3)


def test_a_bad_option_fails_when_the_dag_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="min_isr=0 is not valid"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", min_isr=0)
