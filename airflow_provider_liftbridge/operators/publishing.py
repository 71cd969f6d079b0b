"""Deprecated import path: the publishing operators' base lives in
:mod:`airflow_provider_liftbridge.operators.publishing_base` (a name that says it is the base,
not another publishing operator beside :mod:`.publish`). Importing this module warns."""

from __future__ import annotations

import warnings

from airflow.exceptions import AirflowProviderDeprecationWarning

from .publishing_base import (
    DEFAULT_BATCH_SIZE,
    MAX_IN_FLIGHT,
    PUBLISHING_CHECKS,
    LiftbridgePublishingOperator,
    check_compression_argument,
    check_options_argument,
    warn_deprecated_keyword,
    warn_deprecated_options,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MAX_IN_FLIGHT",
    "PUBLISHING_CHECKS",
    "LiftbridgePublishingOperator",
    "check_compression_argument",
    "check_options_argument",
    "warn_deprecated_keyword",
    "warn_deprecated_options",
]

warnings.warn(
    "airflow_provider_liftbridge.operators.publishing is deprecated: import from "
    "airflow_provider_liftbridge.operators.publishing_base",
    AirflowProviderDeprecationWarning,
    stacklevel=2,
)
