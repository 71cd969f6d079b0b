"""``LiftbridgeUiPlugin``: registers the Liftbridge view with Airflow's api-server.

Registered through the ``airflow.plugins`` entry point (``pyproject.toml``), which Airflow loads
with its default configuration, so installing the package is enough (see ``docs/ui.md``). It is
not also a provider plugin (``get_provider_info()["plugins"]``): with ``[core]
lazy_discover_providers = False`` Airflow would load it a second time and report "already
registered". The FastAPI app is mounted at :data:`URL_PREFIX`; the external view adds a
"Liftbridge" entry under Browse that opens its page inside the Airflow UI. Its ``href`` is
relative (:data:`VIEW_HREF`): the UI resolves it against its ``<base href>``, which is
``[api] base_url``'s path, so the view works when Airflow is served under a path prefix.

Airflow loads plugins in every task process too (for their macros), so this module stays light:
the app (Airflow's API stack, seconds of imports on a busy worker) is built on its first request,
which only the api-server ever serves.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from .paths import URL_PREFIX, URL_ROUTE, VIEW_HREF

__all__ = ["URL_PREFIX", "URL_ROUTE", "VIEW_HREF", "LiftbridgeUiPlugin", "LazyViewApp"]


class LazyViewApp:
    """An ASGI app that builds :data:`airflow_provider_liftbridge.ui.api.app` on first use."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            # Imported here, not at the top: the import's cost belongs to the api-server alone.
            from .api import app

            self._app = app
        await self._app(scope, receive, send)


class LiftbridgeUiPlugin(AirflowPlugin):
    """The Liftbridge view: cluster, pipelines with lag, dead letters, a message browser."""

    name = "liftbridge_ui"
    fastapi_apps = [{"app": LazyViewApp(), "url_prefix": URL_PREFIX, "name": "Liftbridge view"}]
    external_views = [
        {
            "name": "Liftbridge",
            "href": VIEW_HREF,
            "destination": "nav",
            "category": "browse",
            "url_route": URL_ROUTE,
        }
    ]
