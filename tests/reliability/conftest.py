"""Fault-injection suite: every test here carries the ``reliability`` marker. Airflow is
configured (temporary home, SQLite) as for the Airflow-layer folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.airflow_conftest import *  # noqa: F403

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)
