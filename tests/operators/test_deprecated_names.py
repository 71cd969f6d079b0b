"""Renamed parameters of the reading operators keep working, with a deprecation warning (the
publishing operators' removed names: tests/operators/test_publishing_names.py)."""

from __future__ import annotations

import warnings

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

# -- moved modules: the old import paths of the operators' bases -----------------------------


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("reading", "reading_base", "LiftbridgeReadingOperator"),
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


# -- dead letters: one value for the reading operators ----------------------------------------


def _consume(**kwargs: object) -> object:
    from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator

    return LiftbridgeConsumeOperator(task_id="c", stream="s", cursor_id="c", apply_function=print, **kwargs)  # type: ignore[arg-type]


def test_dead_letters_is_one_value() -> None:
    from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = _consume(dead_letters=DeadLetterStream("dlq", create=True))
    assert op.dead_letters == DeadLetterStream("dlq", create=True)  # type: ignore[attr-defined]
    assert op.dead_letter_target() == "dlq"  # type: ignore[attr-defined]
    assert _consume().dead_letters is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("old", "folded", "words"),
    [
        (
            {"on_error": "dead_letter", "dead_letter_stream": "dlq", "create_dead_letter_stream": True},
            ("dlq", True),
            "use dead_letters=DeadLetterStream\\('dlq', create=True\\)",
        ),
        ({"on_error": "dead_letter", "dead_letter_stream": "dlq"}, ("dlq", False), "DeadLetterStream\\('dlq'\\)"),
        ({"on_error": "fail"}, None, "use no dead_letters"),
        ({"on_error": "fail", "dead_letter_stream": "dlq"}, None, "use no dead_letters"),  # it was never used
    ],
)
def test_the_three_old_dead_letter_keywords_still_work_and_warn(
    old: dict[str, object], folded: tuple[str, bool] | None, words: str
) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=words):
        op = _consume(**old)
    assert op.dead_letters == folded  # type: ignore[attr-defined]


def test_dead_letters_is_templated_and_rendered_as_a_whole() -> None:
    import jinja2

    from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the templated value waits for rendering
        op = _consume(dead_letters=DeadLetterStream("{{ params.dlq }}", create=True))
    assert "dead_letters" in op.template_fields  # type: ignore[attr-defined]
    op.render_template_fields({"params": {"dlq": "orders-dlq"}}, jinja2.Environment())  # type: ignore[attr-defined]
    assert op.dead_letters == DeadLetterStream("orders-dlq", create=True)  # type: ignore[attr-defined]
    assert isinstance(op.dead_letters, DeadLetterStream)  # type: ignore[attr-defined]
    bad = _consume(dead_letters=DeadLetterStream("{{ params.dlq }}"))
    with pytest.raises(LiftbridgeArgumentError, match="dead_letters.stream='' is not valid"):
        bad.render_template_fields({"params": {"dlq": ""}}, jinja2.Environment())  # type: ignore[attr-defined]
