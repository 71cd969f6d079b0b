"""Architecture rules: the core imports neither Airflow nor PySpark, and every room exists."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

ROOMS = ["codec", "client", "hooks", "operators", "sensors", "triggers", "spark", "devserver"]

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('airflow', 'pyspark'):
            raise ImportError('the core must not import ' + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib
pkg = importlib.import_module('airflow_provider_liftbridge.{room}')
for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):
    importlib.import_module(info.name)
print('ok')
"""


@pytest.mark.parametrize("room", ["codec", "client"])
def test_core_imports_neither_airflow_nor_pyspark(room: str) -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKER.format(room=room)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_has_a_docstring(room: str) -> None:
    module = importlib.import_module(f"airflow_provider_liftbridge.{room}")
    assert module.__doc__ and len(module.__doc__.strip()) > 20
