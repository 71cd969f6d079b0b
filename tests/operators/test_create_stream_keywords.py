"""``LiftbridgeCreateStreamOperator`` says each stream option one way: ``partitions`` (templated)
as its own keyword, every other option inside ``options=StreamOptions(...)``. The other way of
each is refused when the DAG is parsed, naming the form to write."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
from datetime import timedelta

import pytest

from airflow_provider_liftbridge.client import StreamOptions
from airflow_provider_liftbridge.client.stream_options import STREAM_OPTION_NAMES
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeUnknownArgumentError
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator

#: A value other than the default for each option but ``partitions`` (given in ``options``).
OTHER_VALUES = {
    "replication_factor": 1,
    "group": "g",
    "retention_max_bytes": 1,
    "retention_max_messages": 1,
    "retention_max_age": timedelta(hours=1),
    "cleaner_interval": timedelta(minutes=1),
    "segment_max_bytes": 1,
    "segment_max_age": timedelta(hours=1),
    "compact_enabled": True,
    "compact_max_goroutines": 2,
    "auto_pause_time": timedelta(minutes=5),
    "auto_pause_disable_if_subscribers": True,
    "min_isr": 1,
    "optimistic_concurrency_control": True,
    "encryption": False,
}


def test_the_signature_names_partitions_and_options_only() -> None:
    params = inspect.signature(LiftbridgeCreateStreamOperator).parameters
    assert {"partitions", "options"} <= set(params) and params["partitions"].default == 1
    assert not set(STREAM_OPTION_NAMES) - {"partitions"} & set(params)
    assert set(OTHER_VALUES) == set(STREAM_OPTION_NAMES) - {"partitions"}


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_an_option_as_a_keyword_is_refused_naming_the_options_form(name: str) -> None:
    words = rf"no longer takes {name}=.*: write options=StreamOptions\({name}=\.\.\.\)"
    with pytest.raises(LiftbridgeUnknownArgumentError, match=words):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", **{name: OTHER_VALUES[name]})


def test_partitions_inside_options_is_refused_naming_the_keyword() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="not options.partitions; give partitions=N to the operator"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", options=StreamOptions(partitions=3))


def test_options_must_be_a_stream_options_value() -> None:
    with pytest.raises(LiftbridgeArgumentError, match=r"options=\{'retention_max_age': 60\}.*StreamOptions\("):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", options={"retention_max_age": 60})


def test_every_option_given_in_options_is_the_tasks() -> None:
    given = StreamOptions(**OTHER_VALUES)
    op = LiftbridgeCreateStreamOperator(task_id="c", stream="s", partitions="3", options=given)
    assert op.create_options() == given.replace(partitions=3)
    assert {f.name for f in dataclasses.fields(StreamOptions)} - set(op.stream_options()) == {"replication_factor"}


def test_replication_factor_zero_is_liftbridges_one() -> None:
    op = LiftbridgeCreateStreamOperator(task_id="c", stream="s", options=StreamOptions(replication_factor=0))
    assert op.create_options().replication_factor == 1 and op.stream_options() == {}


def test_default_args_and_partial_expand_reach_the_options() -> None:
    from airflow.sdk import DAG

    options = StreamOptions(retention_max_age=timedelta(minutes=1))
    with DAG("d", schedule=None, start_date=dt.datetime(2024, 1, 1), default_args={"partitions": 4}):
        op = LiftbridgeCreateStreamOperator(task_id="c", stream="s")
        mapped = LiftbridgeCreateStreamOperator.partial(task_id="m", options=options).expand(stream=["a", "b"])
    assert op.partitions == 4 and op.create_options().partitions == 4
    assert mapped.partial_kwargs["options"] == options


def test_an_unknown_keyword_names_the_option_meant() -> None:
    with pytest.raises(TypeError, match="did you mean 'partitions'"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", partition=3)


def test_a_bad_partition_count_fails_when_the_dag_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="partitions=-1 is not valid"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", partitions=-1)
