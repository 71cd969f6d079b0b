"""Stream administration operators against the dev server."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    LiftbridgeClient,
    NoSuchStreamError,
    ReadonlyPartitionError,
    StreamExistsError,
    StreamOptions,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.stream import (
    LiftbridgeCreateStreamOperator,
    LiftbridgeDeleteStreamOperator,
    LiftbridgePauseStreamOperator,
    LiftbridgeSetStreamReadonlyOperator,
)

pytestmark = pytest.mark.usefixtures("liftbridge_conn")


def test_create_then_create_again_is_accepted(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    op = LiftbridgeCreateStreamOperator(
        task_id="create", stream=stream_name, subject=f"{stream_name}.subj", partitions=3
    )
    assert op.execute({}) == {"stream": stream_name, "subject": f"{stream_name}.subj", "partitions": 3, "created": True}
    info = liftbridge_client.fetch_metadata([stream_name]).streams[stream_name]
    assert info.subject == f"{stream_name}.subj" and len(info.partitions) == 3
    again = LiftbridgeCreateStreamOperator(task_id="again", stream=stream_name, subject=f"{stream_name}.subj")
    assert again.execute({}) == {
        "stream": stream_name,
        "subject": f"{stream_name}.subj",
        "partitions": 3,
        "created": False,
    }


def test_create_existing_fails_when_asked(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    with pytest.raises(StreamExistsError):
        LiftbridgeCreateStreamOperator(task_id="c", stream=stream_name, fail_if_exists=True).execute({})


def test_create_existing_on_another_subject_is_an_error(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream("elsewhere." + stream_name, stream_name)
    with pytest.raises(LiftbridgeAirflowError, match="already exists on subject 'elsewhere"):
        LiftbridgeCreateStreamOperator(task_id="c", stream=stream_name).execute({})


def test_stream_options_reach_the_server(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    from airflow_provider_liftbridge.client import IncorrectOffsetError, PublishError

    op = LiftbridgeCreateStreamOperator(
        task_id="c",
        stream=stream_name,
        options=StreamOptions(
            optimistic_concurrency_control=True,
            retention_max_age=timedelta(hours=1),
            segment_max_age=timedelta(hours=2),
            retention_max_messages=1000,
        ),
    )
    assert op.stream_options() == {
        "optimistic_concurrency_control": True,
        "retention_max_messages": 1000,
        "retention_max_age": timedelta(hours=1),
        "segment_max_age": timedelta(hours=2),
    }
    op.execute({})
    # Optimistic concurrency control is observable: a wrong expected offset is refused.
    assert liftbridge_client.publish(stream_name, b"first", expected_offset=0).offset == 0
    with pytest.raises((IncorrectOffsetError, PublishError)):
        liftbridge_client.publish(stream_name, b"late", expected_offset=0)


def test_bad_duration_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match="auto_pause_time must be a datetime.timedelta, got 'soon'"):
        LiftbridgeCreateStreamOperator(task_id="c", stream="s", options=StreamOptions(auto_pause_time="soon"))


def test_delete_is_forgiving_unless_asked(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    assert LiftbridgeDeleteStreamOperator(task_id="d", stream=stream_name).execute({}) == {
        "stream": stream_name,
        "deleted": True,
    }
    assert stream_name not in liftbridge_client.fetch_metadata([stream_name]).streams
    assert LiftbridgeDeleteStreamOperator(task_id="d", stream=stream_name).execute({})["deleted"] is False
    with pytest.raises(NoSuchStreamError):
        LiftbridgeDeleteStreamOperator(task_id="d", stream=stream_name, fail_if_missing=True).execute({})


def test_pause_partitions(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    result = LiftbridgePauseStreamOperator(task_id="p", stream=stream_name, partitions=["1"], resume_all=True).execute(
        {}
    )
    assert result == {"stream": stream_name, "partitions": [1], "resume_all": True}
    partitions = liftbridge_client.fetch_metadata([stream_name]).streams[stream_name].partitions
    assert partitions[1].paused and not partitions[0].paused


def test_pause_missing_stream_fails(stream_name: str) -> None:
    with pytest.raises(NoSuchStreamError):
        LiftbridgePauseStreamOperator(task_id="p", stream=stream_name).execute({})


def test_readonly_and_back(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    result = LiftbridgeSetStreamReadonlyOperator(task_id="r", stream=stream_name).execute({})
    assert result == {"stream": stream_name, "partitions": None, "readonly": True}
    with pytest.raises(ReadonlyPartitionError):
        liftbridge_client.publish(stream_name, b"refused")
    LiftbridgeSetStreamReadonlyOperator(task_id="w", stream=stream_name, readonly=False).execute({})
    assert liftbridge_client.publish(stream_name, b"accepted").offset == 0


def test_bad_partitions_argument() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="partitions"):
        LiftbridgePauseStreamOperator(task_id="p", stream="s", partitions=[-1]).execute({})
