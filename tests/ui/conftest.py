"""Airflow-layer fixtures (tests/airflow_conftest.py) and the view's app behind Airflow's auth."""

from tests.airflow_conftest import *  # noqa: F403
