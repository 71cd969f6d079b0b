"""Renamed parameters keep working, with a deprecation warning: the publishing operators'
``window`` (records per batch) is ``batch_size`` now."""

from __future__ import annotations

import warnings

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_liftbridge.client import ConnectionSettings
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publishing import DEFAULT_BATCH_SIZE, MAX_IN_FLIGHT


def _publish(**kwargs: object) -> LiftbridgePublishOperator:
    return LiftbridgePublishOperator(task_id="p", stream="s", records=[], **kwargs)  # type: ignore[arg-type]


def test_batch_size_is_the_records_per_batch_and_bounds_the_window() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        op = _publish(batch_size=50)
    assert op.batch_size == 50 and op.window is None
    settings = ConnectionSettings(["127.0.0.1:1"])
    assert op.publish_options(settings).window == 50
    assert _publish(batch_size=5000).publish_options(settings).window == MAX_IN_FLIGHT
    assert _publish().batch_size == DEFAULT_BATCH_SIZE


def test_window_still_works_and_warns() -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match="use batch_size=20"):
        op = _publish(window=20)
    assert op.batch_size == 20
    assert op.publish_options(ConnectionSettings(["127.0.0.1:1"])).window == 20


@pytest.mark.parametrize(("keyword", "words"), [("batch_size", "batch_size=0 is not valid"), ("window", "window=0")])
def test_each_name_is_checked_under_its_own_name(keyword: str, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        _publish(**{keyword: 0})
