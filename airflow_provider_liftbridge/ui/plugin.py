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

import threading
from importlib import import_module
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from .paths import URL_PREFIX, URL_ROUTE, VIEW_HREF

__all__ = ["URL_PREFIX", "URL_ROUTE", "VIEW_HREF", "LiftbridgeUiPlugin", "LazyViewApp", "WarmUpMiddleware"]


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


class WarmUpMiddleware:
    """A pass-through root middleware of the api-server that, when the server starts (the ASGI
    lifespan, which only an api-server runs: task processes never build a FastAPI app), imports
    the view's app in a background thread. The first Browse → Liftbridge click then does not wait
    for those imports (half a second on an idle 2-core machine, seconds under load:
    ``bench/ui_bench.py``). Requests pass through untouched."""

    _started = threading.Event()

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and not self._started.is_set():
            self._started.set()
            # A daemon thread: a failed import here is retried, and reported, by the first request.
            threading.Thread(target=_import_app, name="liftbridge-view-warm-up", daemon=True).start()
        await self.app(scope, receive, send)


def _import_app() -> None:
    try:
        import_module(f"{__package__}.api")
    except Exception:  # noqa: BLE001  # LazyViewApp imports it again on the first request and fails there
        pass


class LiftbridgeUiPlugin(AirflowPlugin):
    """The Liftbridge view: cluster, pipelines with lag, dead letters, a message browser."""

    name = "liftbridge_ui"
    fastapi_apps = [{"app": LazyViewApp(), "url_prefix": URL_PREFIX, "name": "Liftbridge view"}]
    fastapi_root_middlewares = [{"middleware": WarmUpMiddleware, "name": "Liftbridge view warm-up"}]
    external_views = [
        {
            "name": "Liftbridge",
            "href": VIEW_HREF,
            "destination": "nav",
            "category": "browse",
            "url_route": URL_ROUTE,
        }
    ]
