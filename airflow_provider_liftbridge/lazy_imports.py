"""Package attributes imported on first use (PEP 562): a package lists cheap names eagerly and
maps its costly ones to the modules that hold them, so a process that needs few of them (Spark's
planner processes, a gRPC-only reader) does not pay for the rest. Imports neither Airflow nor
PySpark; the core (``client``) uses it too."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_attributes(
    package: str, where: Mapping[str, str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``where`` is imported from
    the module it maps to on first use, then kept in the package (later lookups skip the hook).

    :param package: the package's ``__name__``.
    :param where: name -> the module that defines it.
    :param names: every public name (``__all__``), for ``dir()``.
    """
    listed = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | listed)

    return __getattr__, __dir__
