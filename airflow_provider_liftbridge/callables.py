"""The one rule for every parameter that names a function (``apply_function``,
``apply_function_batch``, ``records_callable``, ``dataframe_callable``, ``on_file``...).

- When the DAG is parsed, a dotted path is checked for its **shape only**
  (:func:`check_function`): a dotted name of identifiers, ``"my_pkg.handlers.handle"`` (or
  ``"my_pkg.handlers:handle"``). Its module is not imported: Airflow's dag-processor re-parses the
  file every 30 s, often in another image than the workers, and must not need the function's
  package nor pay for its import.
- It is imported where the function runs (:func:`import_function`): the worker in ``execute()``,
  the triggerer in the trigger, the Spark driver. The error there names the parameter, the path,
  the cause, and where the module must be importable.
- A callable given directly (where the parameter takes one) is used as it is.

No Airflow here: the Spark room and the ``spark-submit`` job use the same rule. The errors are
:class:`FunctionPathError`; the Airflow layer turns them into ``LiftbridgeArgumentError``
(:mod:`airflow_provider_liftbridge.validation`), the Spark room into ``SparkOptionError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "SPARK_DRIVER",
    "TRIGGERER",
    "WORKER",
    "FunctionPathError",
    "check_function",
    "check_function_path",
    "import_function",
]

#: Where a function is imported: the places named in :func:`import_function`'s error.
WORKER = "the Airflow worker (where the task runs)"
TRIGGERER = "the triggerer (where the trigger runs)"
SPARK_DRIVER = "the Spark driver (where the DataFrame is built)"


class FunctionPathError(ValueError):
    """A parameter naming a function is malformed, cannot be imported, or names no callable (the
    message names the parameter, the value and what to do)."""


def _split(path: str) -> tuple[str, str] | None:
    """``(module, attribute)`` of ``"pkg.mod.func"`` or ``"pkg.mod:func"``; ``None`` for another shape."""
    if path.count(":") > 1:
        return None
    module, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module or not all(part.isidentifier() for part in module.split(".")):
        return None
    return (module, attr) if attr.isidentifier() else None


def check_function_path(value: Any, name: str) -> str:
    """A dotted path of a function, checked for its shape only (nothing is imported).

    :raises FunctionPathError: not a string of dot-separated identifiers with at least one dot.
    """
    if not isinstance(value, str) or _split(value.strip()) is None:
        raise FunctionPathError(
            f"{name}={value!r} is not valid: a dotted path of a function is required, such as "
            f"{name}='my_pkg.handlers.handle' (module 'my_pkg.handlers', function 'handle'); it is imported "
            "where the function runs, not when the DAG is parsed"
        )
    return value.strip()


def check_function(value: Any, name: str) -> Callable[..., Any] | str:
    """A callable (used as it is) or a dotted path checked by :func:`check_function_path`.

    :raises FunctionPathError: neither.
    """
    if callable(value):
        function: Callable[..., Any] = value
        return function
    try:
        return check_function_path(value, name)
    except FunctionPathError:
        raise FunctionPathError(
            f"{name}={value!r} is not valid: a callable or the dotted path of a function is required, such as "
            f"{name}='my_pkg.handlers.handle'; a dotted path is imported where the function runs, not when the "
            "DAG is parsed"
        ) from None


def import_function(value: Any, name: str, where: str) -> Callable[..., Any]:
    """The function ``value`` names: a callable as it is, a dotted path imported in this process.

    :param value: a callable or a dotted path (``"my_pkg.handlers.handle"``).
    :param name: the parameter, named in the error.
    :param where: the process this runs in (:data:`WORKER`, :data:`TRIGGERER`, :data:`SPARK_DRIVER`),
        named in the error as where the module must be importable.
    :raises FunctionPathError: ``value`` has not the shape of a dotted path, its module cannot be
        imported (or raises while it is), it has no such attribute, or that is not callable.
    """
    if callable(value):
        return value  # type: ignore[no-any-return]
    path = check_function_path(value, name)
    module_name, attr = _split(path) or ("", "")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised while it was imported
        raise FunctionPathError(
            f"{name}={path!r} cannot be imported on {where}: {type(exc).__name__}: {exc}. Make module "
            f"{module_name!r} importable there (install its package, or put it in the DAGs or plugins folder); "
            "only the process that runs the function imports it, not the DAG processor"
        ) from exc
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise FunctionPathError(
            f"{name}={path!r} cannot be imported on {where}: module {module_name!r} has no attribute {attr!r}; "
            "check the function's name"
        ) from None
    if not callable(target):
        raise FunctionPathError(
            f"{name}={path!r} is not callable ({type(target).__name__}): name a function of module {module_name!r}"
        )
    return target  # type: ignore[no-any-return]
