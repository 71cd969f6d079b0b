"""The Airflow layer's errors moved to :mod:`airflow_provider_liftbridge.exceptions` (one neutral
module for every Airflow room); this name stays for code written before the move."""

from __future__ import annotations

from airflow_provider_liftbridge.exceptions import (
    LiftbridgeAirflowError,
    LiftbridgeArgumentError,
    LiftbridgeConnectionConfigError,
    LiftbridgeFileError,
    LiftbridgePublishNotAcknowledgedError,
    LiftbridgeTriggerEventError,
)

__all__ = [
    "LiftbridgeAirflowError",
    "LiftbridgeArgumentError",
    "LiftbridgeConnectionConfigError",
    "LiftbridgeFileError",
    "LiftbridgePublishNotAcknowledgedError",
    "LiftbridgeTriggerEventError",
]
