"""Validation is a step of its own: it runs once, when the outermost ``__init__`` returns, with
every attribute of every class set, whatever the subclass (argument_checks.ArgumentChecks)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_liftbridge.client import PublishOptions
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.base import LiftbridgeBaseOperator
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.validation import bad_argument, check_positive_int

CALLS: list[tuple[str, bool]] = []


class Counting(LiftbridgeBaseOperator):
    argument_checks = {"size": check_positive_int}

    def __init__(self, *, size: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = size

    def check_combination(self, *, rendered: bool) -> None:
        super().check_combination(rendered=rendered)
        CALLS.append((type(self).__name__, rendered))


class Derived(Counting):
    """Sets its own attribute after the base's ``__init__``; its rule reads it, no guard."""

    def __init__(self, *, limit: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limit = limit

    def check_combination(self, *, rendered: bool) -> None:
        super().check_combination(rendered=rendered)
        if self.size > self.limit:
            raise bad_argument("size", self.size, f"at most limit={self.limit}")


def test_the_checks_run_once_when_the_object_is_built() -> None:
    CALLS.clear()
    Derived(task_id="t", stream="s", size=3)
    assert CALLS == [("Derived", False)]
    assert "_argument_checks_building" not in vars(Derived(task_id="u", stream="s"))


def test_a_rule_on_a_subclass_attribute_sees_it() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="size=11 is not valid: at most limit=10"):
        Derived(task_id="t", stream="s", size=11)
    with pytest.raises(LiftbridgeArgumentError, match="size=0 is not valid"):
        Derived(task_id="t", stream="s", size=0)


def test_a_subclass_of_a_provider_operator_is_checked_after_its_own_init() -> None:
    class Mine(LiftbridgePublishOperator):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.exactly_once = True  # set after the base's __init__, checked with the options' ack policy

    with pytest.raises(LiftbridgeArgumentError, match="exactly_once=True needs acknowledgements"):
        Mine(task_id="t", stream="s", records=[], options=PublishOptions(ack_policy="none"))
    assert Mine(task_id="t", stream="s", records=[], options=PublishOptions(ack_policy="all")).exactly_once is True
