"""Airflow-layer fixtures: see tests/airflow_conftest.py."""

from tests.airflow_conftest import *  # noqa: F403
