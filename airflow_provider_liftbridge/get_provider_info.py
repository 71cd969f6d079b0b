"""Provider metadata, registered through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_liftbridge import __version__


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager reads."""
    return {
        "package-name": "airflow-provider-liftbridge",
        "name": "Liftbridge",
        "description": "Liftbridge (durable streams on NATS): hook, stream and publish operators, "
        "deferrable sensors and triggers, Spark DataFrame publishing.",
        "versions": [__version__],
    }
