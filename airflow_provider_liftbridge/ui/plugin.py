"""``LiftbridgeUiPlugin``: registers the Liftbridge view with Airflow's api-server.

Registered by the provider (``get_provider_info()["plugins"]``), so installing the package is
enough. The FastAPI app is mounted at :data:`~.api.URL_PREFIX`; the external view adds a
"Liftbridge" entry under Browse that opens its page inside the Airflow UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from .api import URL_PREFIX, app

__all__ = ["LiftbridgeUiPlugin"]


class LiftbridgeUiPlugin(AirflowPlugin):
    """The Liftbridge view: cluster, pipelines with lag, dead letters, a message browser."""

    name = "liftbridge_ui"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Liftbridge view"}]
    external_views = [
        {
            "name": "Liftbridge",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "liftbridge",
        }
    ]
