"""The one rule for parameters naming a function (airflow_provider_liftbridge.callables): the shape
check accepts dotted names of identifiers and nothing else, and the import names the parameter,
the path, the cause and the process the module must be importable in."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.callables import (
    SPARK_DRIVER,
    TRIGGERER,
    WORKER,
    FunctionPathError,
    check_function,
    check_function_path,
    import_function,
)
from tests.worker_module import WorkerModule


@pytest.mark.parametrize("path", ["a.b", "my_pkg.handlers.handle", "my_pkg.handlers:handle", "a:b", " a.b "])
def test_dotted_names_of_identifiers_are_accepted_without_importing(path: str) -> None:
    assert check_function_path(path, "f") == path.strip()
    assert check_function(path, "f") == path.strip()


@pytest.mark.parametrize(
    "value", ["handle", "a.", ".a", "a..b", "a.b:c.d", "a:b:c", "1a.b", "a.b-c", "a b.c", "", None, 3]
)
def test_other_values_are_refused_naming_the_parameter(value: Any) -> None:
    with pytest.raises(FunctionPathError, match=r"^apply_function=.* is not valid: a dotted path"):
        check_function_path(value, "apply_function")
    with pytest.raises(FunctionPathError, match=r"^apply_function=.* is not valid: a callable or the dotted path"):
        check_function(value, "apply_function")


def test_a_callable_is_taken_as_it_is_where_the_parameter_takes_one() -> None:
    assert check_function(json.dumps, "f") is json.dumps
    assert import_function(json.dumps, "f", WORKER) is json.dumps
    with pytest.raises(FunctionPathError):
        check_function_path(json.dumps, "f")


def test_import_names_the_parameter_path_cause_and_place(tmp_path: Path) -> None:
    assert import_function("json.dumps", "f", WORKER) is json.dumps
    assert import_function("json:loads", "f", WORKER) is json.loads
    module = WorkerModule(tmp_path)
    path = module.path("handle")
    for where in (WORKER, TRIGGERER, SPARK_DRIVER):
        with pytest.raises(FunctionPathError) as raised:
            import_function(path, "on_file", where)
        assert str(raised.value).startswith(
            f"on_file={path!r} cannot be imported on {where}: ModuleNotFoundError: No module named '{module.name}'. "
            f"Make module '{module.name}' importable there"
        )
    with module.on_path():
        assert import_function(path, "on_file", WORKER).__name__ == "handle"
    with pytest.raises(FunctionPathError, match="module 'json' has no attribute 'nope'; check the function's name"):
        import_function("json.nope", "f", WORKER)
    with pytest.raises(FunctionPathError, match="'json.__doc__' is not callable"):
        import_function("json.__doc__", "f", WORKER)


def test_a_module_that_raises_while_imported_is_named_with_what_it_raised(tmp_path: Path) -> None:
    name = "worker_only_broken_module"
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('no config here')\n", encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(FunctionPathError, match="cannot be imported on .*: RuntimeError: no config here") as raised:
            import_function(f"{name}.handle", "apply_function", TRIGGERER)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    assert isinstance(raised.value.__cause__, RuntimeError)  # the module's own traceback is kept
