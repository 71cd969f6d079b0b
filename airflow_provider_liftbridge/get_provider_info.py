"""Provider metadata, registered through the ``apache_airflow_provider`` entry point.

Airflow's ProvidersManager reads it without importing hooks: the ``liftbridge`` connection form
(``conn-fields``, ``ui-field-behaviour``) is declared here as data (from
:mod:`airflow_provider_liftbridge.connection_fields`, which imports nothing).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_liftbridge import __version__
from airflow_provider_liftbridge.connection_fields import connection_type_info

INTEGRATION = "Liftbridge"
_PKG = "airflow_provider_liftbridge"


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager reads."""
    return {
        "package-name": "airflow-provider-liftbridge",
        "name": "Liftbridge",
        "description": "Liftbridge (durable streams on NATS): hook, stream and publish operators, "
        "deferrable sensors and triggers, Spark DataFrame publishing.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://liftbridge.io/",
                "tags": ["service"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [f"{_PKG}.hooks.base", f"{_PKG}.hooks.async_hook"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    f"{_PKG}.operators.stream",
                    f"{_PKG}.operators.publish",
                    f"{_PKG}.operators.publish_file",
                    f"{_PKG}.operators.consume",
                    f"{_PKG}.operators.stream_to_file",
                    f"{_PKG}.operators.spark",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [f"{_PKG}.sensors.offset", f"{_PKG}.sensors.ack", f"{_PKG}.sensors.message"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    f"{_PKG}.triggers.offset",
                    f"{_PKG}.triggers.ack",
                    f"{_PKG}.triggers.message",
                    f"{_PKG}.triggers.event",
                ],
            }
        ],
        # Read by the common.messaging provider (MessageQueueTrigger, scheme "liftbridge").
        "queues": [f"{_PKG}.queues.liftbridge.LiftbridgeMessageQueueProvider"],
        "connection-types": [connection_type_info()],
        # Buttons on task instances that open the Liftbridge view (docs/ui.md).
        "extra-links": [
            f"{_PKG}.operators.links.LiftbridgeStreamLink",
            f"{_PKG}.operators.links.LiftbridgePipelineLink",
        ],
        # No "plugins": the Liftbridge view registers through the ``airflow.plugins`` entry point
        # (pyproject.toml), which Airflow loads with its default configuration; listed here too,
        # it would be loaded twice when [core] lazy_discover_providers = False.
    }
