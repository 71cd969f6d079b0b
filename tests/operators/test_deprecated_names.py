"""Renamed parameters keep working, with a deprecation warning: the publishing operators'
``window`` (records per batch) is ``batch_size`` now."""

from __future__ import annotations

import warnings

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_liftbridge.client import ConnectionSettings
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publishing_base import DEFAULT_BATCH_SIZE, MAX_IN_FLIGHT


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


# -- transport tuning: one ``options`` value ---------------------------------------------------


def test_options_is_the_one_home_of_the_transport_tuning() -> None:
    from airflow_provider_liftbridge.client import AckPolicy, PublishOptions

    settings = ConnectionSettings(["127.0.0.1:1"], timeout=7.0)
    given = PublishOptions(path="grpc", timeout=3.0, compression="gzip", window=64, ack_policy=AckPolicy.ALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = _publish(options=given)
    made = op.publish_options(settings)
    assert (made.path, made.timeout, made.compression, made.window, made.ack_policy) == (
        "grpc",
        3.0,
        "gzip",
        64,
        AckPolicy.ALL,
    )
    # Unset: the connection's timeout and ack policy, the window from the batch size.
    plain = _publish(batch_size=10).publish_options(settings)
    assert (plain.path, plain.timeout, plain.window, plain.ack_policy) == ("auto", 7.0, 10, settings.ack_policy)
    # The operator's own keywords win where they are set.
    assert _publish(options=given, ack_policy="leader").publish_options(settings).ack_policy is AckPolicy.LEADER


@pytest.mark.parametrize(
    ("keyword", "value", "field"),
    [("publish_path", "grpc", "path"), ("publish_timeout", 2.5, "timeout"), ("compression", "gzip", "compression")],
)
def test_the_old_transport_keywords_still_work_and_warn(keyword: str, value: object, field: str) -> None:
    from airflow_provider_liftbridge.client import PublishOptions

    with pytest.warns(AirflowProviderDeprecationWarning, match=f"use options=PublishOptions\\({field}="):
        op = _publish(**{keyword: value}, options=PublishOptions(path="nats", timeout=9.0))
    assert getattr(op.publish_options(ConnectionSettings(["127.0.0.1:1"])), field) == value  # the keyword wins


def test_options_must_be_a_publish_options_value() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="options=.* is not valid: a PublishOptions value is required"):
        _publish(options={"path": "grpc"})


def test_exactly_once_refuses_an_ack_policy_of_none_from_the_options_too() -> None:
    from airflow_provider_liftbridge.client import AckPolicy, PublishOptions

    with pytest.raises(LiftbridgeArgumentError, match="exactly_once=True needs acknowledgements"):
        _publish(exactly_once=True, options=PublishOptions(ack_policy=AckPolicy.NONE))


# -- moved modules: the old import paths of the operators' bases -----------------------------


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("publishing", "publishing_base", "LiftbridgePublishingOperator"),
    ],
)
def test_the_old_module_of_a_base_still_imports_and_warns(old: str, new: str, name: str) -> None:
    import importlib
    import sys

    package = "airflow_provider_liftbridge.operators"
    sys.modules.pop(f"{package}.{old}", None)  # imported afresh, so its warning is raised here
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"import from {package}.{new}"):
        module = importlib.import_module(f"{package}.{old}")
    assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{new}"), name)
    assert set(module.__all__) == set(importlib.import_module(f"{package}.{new}").__all__)
