"""Deprecated import path: the reading operators' base lives in
:mod:`airflow_provider_liftbridge.operators.reading_base` (a name that says it is the base of
:mod:`.consume` and :mod:`.stream_to_file`, not another reading operator). Importing this module warns."""

from __future__ import annotations

import warnings

from airflow.exceptions import AirflowProviderDeprecationWarning

from .reading_base import LiftbridgeReadingOperator, parse_partitions, parse_reading_start, plan_key_of

__all__ = ["LiftbridgeReadingOperator", "parse_partitions", "parse_reading_start", "plan_key_of"]

warnings.warn(
    "airflow_provider_liftbridge.operators.reading is deprecated: import from "
    "airflow_provider_liftbridge.operators.reading_base",
    AirflowProviderDeprecationWarning,
    stacklevel=2,
)
