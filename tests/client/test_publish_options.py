"""``PublishOptions``: the one options value of publishing, checked when it is made."""

from __future__ import annotations

import pytest

from airflow_provider_liftbridge.client import NO_RESEND, AckPolicy, InvalidArgumentError, KeyPartitioner
from airflow_provider_liftbridge.client.publishing.options import GRPC_WINDOW, NATS_WINDOW, PublishOptions


def test_defaults_leave_every_choice_to_the_publisher() -> None:
    options = PublishOptions()
    assert (options.path, options.ack_policy, options.window, options.timeout, options.resend) == (
        "auto",
        None,
        None,
        None,
        None,
    )
    assert options.window_for("nats") == NATS_WINDOW and options.window_for("grpc") == GRPC_WINDOW
    assert PublishOptions(window=7).window_for("nats") == 7


def test_values_are_normalised_and_frozen() -> None:
    options = PublishOptions(ack_policy=1, timeout=3, compression="GZIP", partitioner=KeyPartitioner())  # type: ignore[arg-type]
    assert options.ack_policy is AckPolicy.ALL
    assert options.timeout == 3.0 and isinstance(options.timeout, float)
    assert options.compression == "gzip"
    with pytest.raises(AttributeError):
        options.window = 5  # type: ignore[misc]


def test_rendered_strings_are_read_as_the_operators_read_them() -> None:
    """The checks are the operators' (client/checks.py): a rendered template is a string."""
    options = PublishOptions(partition="2", ack_policy="all", window=" 64 ", timeout="2.5", partitioner=None)  # type: ignore[arg-type]
    assert (options.partition, options.ack_policy, options.window, options.timeout) == (2, AckPolicy.ALL, 64, 2.5)
    assert PublishOptions(partition="", timeout="").partition is None  # type: ignore[arg-type]


def test_resolved_fills_in_only_what_is_unset() -> None:
    unset = PublishOptions().resolved(AckPolicy.ALL, 20.0)
    assert (unset.ack_policy, unset.timeout) == (AckPolicy.ALL, 20.0)
    own = PublishOptions(ack_policy=AckPolicy.NONE, timeout=1.5, resend=NO_RESEND).resolved(AckPolicy.ALL, 20.0)
    assert (own.ack_policy, own.timeout, own.resend) == (AckPolicy.NONE, 1.5, NO_RESEND)


@pytest.mark.parametrize(
    ("changes", "named", "fix"),
    [
        ({"path": "carrier-pigeon"}, "path='carrier-pigeon'", "use one of 'auto', 'nats', 'grpc'"),
        ({"path": "nat"}, "path='nat'", "did you mean 'nats'?"),
        ({"partition": -1}, "partition=-1", "e.g. partition=0"),
        ({"partition": True}, "partition=True", "e.g. partition=0"),
        ({"partitioner": "key"}, "partitioner='key'", "KeyPartitioner()"),
        ({"ack_policy": 7}, "ack_policy=7", "e.g. ack_policy='all'"),
        ({"ack_policy": "sometimes"}, "ack_policy='sometimes'", "'leader', 'all', 'none'"),
        ({"window": 0}, "window=0", "a whole number, 1 or more"),
        ({"window": 2.5}, "window=2.5", "a whole number, 1 or more"),
        ({"timeout": -5}, "timeout=-5", "leave it unset for the default"),
        ({"timeout": "soon"}, "timeout='soon'", "a positive number of seconds"),
        ({"resend": 2}, "resend=2", "NO_RESEND"),
        ({"compression": "lz4"}, "compression", "'gzip', 'zstd' or None"),
    ],
)
def test_a_bad_value_names_the_option_and_the_fix(changes: dict[str, object], named: str, fix: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        PublishOptions(**changes)  # type: ignore[arg-type]
    assert named in str(caught.value) and fix in str(caught.value)
    with pytest.raises(InvalidArgumentError):
        PublishOptions().replace(**changes)  # checked again on every copy
