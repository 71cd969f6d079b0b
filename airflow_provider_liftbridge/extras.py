"""What each optional extra of the package brings, and the one error every part raises without it.

The base install (``pip install airflow-provider-liftbridge``) holds the client, the Airflow layer
and nothing optional. A part that needs an extra imports the extra's packages inside
:func:`needs_extra`; when they are missing, the import fails with :class:`MissingExtraError`, whose
message is one line naming the extra and the ``pip install`` command that adds it. The console
scripts print that line (no traceback) and exit 1: see :func:`run_console_script`.

This module imports nothing beyond the standard library: the core, the dev server and Spark
executors all use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DISTRIBUTION", "EXTRAS", "MissingExtraError", "install_command", "needs_extra", "run_console_script"]

#: The distribution name users install.
DISTRIBUTION = "airflow-provider-liftbridge"

#: Each extra of ``pyproject.toml`` that a part of the package needs at run time, and the
#: importable modules it brings (top-level names, or dotted prefixes): a failed import of one of
#: them is reported as that extra missing; any other failed import passes through unchanged.
EXTRAS: dict[str, tuple[str, ...]] = {
    "devserver": ("h2", "hpack", "hyperframe"),
    "spark": ("pyspark", "py4j", "pandas", "pyarrow"),
    "files": ("pyarrow",),
    "zstd": ("zstandard",),
    "nats-nkeys": ("nkeys", "nacl"),
    "openlineage": ("openlineage", "airflow.providers.openlineage"),
}


def install_command(extra: str) -> str:
    """The shell command that installs the package with ``extra``, quoted for any shell.

    :raises KeyError: ``extra`` is not one of :data:`EXTRAS`.
    """
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtraError(ImportError):
    """A part of the package was used without the optional extra it needs.

    The message is one line: what needed it, the extra, what was missing and the install command.

    :param extra: the extra's name, as in ``pyproject.toml`` (``devserver``, ``spark``, ...).
    :param feature: what needs it, as the start of a sentence ("the dev server").
    :param missing: the module that could not be imported.
    :param detail: why, when the module exists but lacks what is needed (else ``None``).
    :raises KeyError: ``extra`` is not one of :data:`EXTRAS`.
    """

    def __init__(self, extra: str, feature: str, missing: str, detail: str | None = None) -> None:
        self.extra = extra
        self.feature = feature
        self.missing = missing
        self.command = install_command(extra)
        what = f"{missing} is not installed" if detail is None else f"{missing} lacks what is needed: {detail}"
        super().__init__(f"{feature} needs the '{extra}' extra ({what}): {self.command}", name=missing)


def _belongs_to(extra: str, module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in EXTRAS[extra])


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Run the imports of ``extra``'s packages in this block; one missing raises :class:`MissingExtraError`.

    An import error of a module that the extra does not bring passes through unchanged (it is not
    a missing extra but a bug or a broken install). ``pyspark-client`` alone (without ``pyspark``)
    has a ``pyspark`` module lacking the classic classes: an ``ImportError`` that is not a
    ``ModuleNotFoundError`` counts as the extra missing too, with its reason.

    :param extra: one of :data:`EXTRAS`.
    :param feature: what needs it, for the message ("the dev server", "compression='zstd'").
    :raises MissingExtraError: a module of ``extra`` could not be imported in the block.
    :raises KeyError: ``extra`` is not one of :data:`EXTRAS`.
    """
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    try:
        yield
    except ImportError as exc:
        if not exc.name or not _belongs_to(extra, exc.name):
            raise
        detail = None if isinstance(exc, ModuleNotFoundError) else str(exc.msg).split(" (", 1)[0]
        raise MissingExtraError(extra, feature, exc.name, detail) from None


def run_console_script(prog: str, target: str) -> int:
    """Import ``target`` (``"package.module:function"``) and call it; a missing extra prints one line.

    The console scripts of ``pyproject.toml`` point here (through :mod:`.cli`) rather than at
    their modules, so that an import failing for want of an extra happens inside this guard:
    ``PROG: error: MESSAGE`` on stderr and exit status 1 instead of a traceback.

    :param prog: the command's name, for the message.
    :param target: the function to run, which takes no arguments and returns the exit status.
    :returns: the function's exit status, or 1 when an extra is missing.
    """
    module_name, _, function = target.partition(":")
    try:
        main = getattr(importlib.import_module(module_name), function)
        status = main()
    except MissingExtraError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return int(status or 0)
