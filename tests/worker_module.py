"""A module that exists only "on the worker": the tests of dotted-path parameters write it into a
temporary folder that is on ``sys.path`` only while the task runs (:meth:`WorkerModule.on_path`),
so the DAG is parsed in a process where the module cannot be imported, and run where it can.

Its functions record each call as one JSON line in a file beside it, so what the task did is seen
after the module is gone from ``sys.path`` and ``sys.modules`` again.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SOURCE = '''"""Functions importable only where the task runs (written by tests/worker_module.py)."""

import json

CALLS = {calls!r}


def _record(**call):
    with open(CALLS, "a", encoding="utf-8") as out:
        out.write(json.dumps(call) + "\\n")


def handle(message, *args, **kwargs):
    _record(function="handle", offset=message.offset, value=message.value.decode(), args=list(args))


def handle_batch(messages, *args, **kwargs):
    for message in messages:
        _record(function="handle_batch", offset=message.offset, value=message.value.decode())


def value_is(message, wanted):
    _record(function="value_is", offset=message.offset, value=message.value.decode())
    return message.value.decode() == wanted


def records(count):
    _record(function="records", count=count)
    return ["record-%d" % i for i in range(count)]


def on_file(entry, **kwargs):
    _record(function="on_file", path=entry["path"], rows=entry["rows"])


def numbers(spark, rows):
    _record(function="numbers", rows=rows)
    return spark.range(rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
'''


class WorkerModule:
    """A uniquely named module in ``folder`` (not on ``sys.path`` until :meth:`on_path`).

    :param folder: an empty temporary folder (``tmp_path``).
    """

    def __init__(self, folder: Path) -> None:
        self.name = f"worker_only_{uuid.uuid4().hex[:10]}"
        self.folder = folder / "worker_site"
        self.folder.mkdir()
        self.calls_file = folder / f"{self.name}.calls.jsonl"
        (self.folder / f"{self.name}.py").write_text(_SOURCE.format(calls=str(self.calls_file)), encoding="utf-8")

    def path(self, function: str) -> str:
        """The dotted path of ``function`` of this module."""
        return f"{self.name}.{function}"

    def importable(self) -> bool:
        """Whether this process can import the module now."""
        importlib.invalidate_caches()
        return importlib.util.find_spec(self.name) is not None

    @contextmanager
    def on_path(self) -> Iterator[None]:
        """The module is importable inside the block (as on a worker that has it), and not after."""
        sys.path.insert(0, str(self.folder))
        importlib.invalidate_caches()
        try:
            yield
        finally:
            sys.path.remove(str(self.folder))
            sys.modules.pop(self.name, None)
            importlib.invalidate_caches()

    def calls(self) -> list[dict[str, Any]]:
        """Every call of the module's functions so far, in order."""
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text(encoding="utf-8").splitlines()]
