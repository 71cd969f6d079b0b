"""``StreamOptions``: create-stream's options as one value, checked when it is made."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import InvalidArgumentError, StreamOptions
from airflow_provider_liftbridge.client.requests import _wire_name, build_create_stream
from airflow_provider_liftbridge.client.stream_options import STREAM_OPTION_NAMES


def test_every_option_has_a_field_of_the_request() -> None:
    fields = api_pb2.CreateStreamRequest.DESCRIPTOR.fields_by_name
    assert {_wire_name(name) for name in STREAM_OPTION_NAMES} <= set(fields)
    # ...and every field of the request but the two positional ones is an option.
    assert set(fields) - {_wire_name(name) for name in STREAM_OPTION_NAMES} == {"subject", "name"}


def test_defaults_leave_the_server_its_own() -> None:
    options = StreamOptions()
    assert (options.partitions, options.replication_factor) == (1, 1)
    assert all(getattr(options, name) is None for name in STREAM_OPTION_NAMES[2:])
    assert options.changed() == {}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"partitions": -1}, "partitions=-1 is not valid"),
        ({"replication_factor": -2}, "replication_factor=-2 is not valid"),
        ({"retention_max_bytes": -1}, "retention_max_bytes=-1 is not valid"),
        ({"compact_enabled": "false"}, "compact_enabled='false' is not valid"),
        ({"min_isr": 0}, "min_isr=0 is not valid"),
        ({"group": " "}, "group=' ' is not valid"),
        ({"segment_max_age": 60}, "segment_max_age must be a datetime.timedelta"),
    ],
)
def test_a_bad_value_fails_when_the_value_is_made(changes: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        StreamOptions(**changes)  # type: ignore[arg-type]


def test_keywords_replace_fields_and_an_unknown_one_is_named() -> None:
    base = StreamOptions(partitions=2, compact_enabled=True)
    assert StreamOptions.of(base, {"partitions": 3}) == StreamOptions(partitions=3, compact_enabled=True)
    assert StreamOptions.of(None, None) == StreamOptions()
    with pytest.raises(TypeError, match="no stream option 'partition' \\(did you mean 'partitions'\\?\\)"):
        StreamOptions.of(None, {"partition": 3})


def test_the_value_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        StreamOptions().partitions = 2  # type: ignore[misc]


def test_the_request_carries_every_option_set() -> None:
    options = StreamOptions(partitions=2, replication_factor=-1, group="g", compact_max_goroutines=4)
    req = build_create_stream("s", "n", options)
    assert (req.partitions, req.replicationFactor, req.group, req.compactMaxGoroutines.value) == (2, -1, "g", 4)
    assert not req.HasField("encryption")
