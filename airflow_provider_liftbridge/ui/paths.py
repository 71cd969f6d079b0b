"""Where the Liftbridge view lives in Airflow's UI, and links into it. Imports nothing of
Airflow: the operators' extra links (:mod:`airflow_provider_liftbridge.operators.links`) build
their addresses here in task processes, the plugin (:mod:`.plugin`) registers the same paths.

Every path is relative to ``[api] base_url`` (Airflow serves its UI and the plugins' apps under
that URL's path), so the view works when Airflow is served under a path prefix.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

__all__ = ["URL_PREFIX", "URL_ROUTE", "VIEW_HREF", "view_url"]

#: Where Airflow mounts the view's app (under ``[api] base_url``'s path).
URL_PREFIX = "/liftbridge"
#: The external view's route in the UI: the page is shown in Airflow's frame at ``plugin/liftbridge``.
URL_ROUTE = "liftbridge"
#: The external view's address, relative to the UI's ``<base href>`` (no leading slash).
VIEW_HREF = f"{URL_PREFIX.lstrip('/')}/"


def view_url(base_url: str, **query: str) -> str:
    """The view inside Airflow's frame, opened with ``query`` (``conn``, ``tab``, ``stream``,
    ``pipeline``: see ``docs/ui.md``).

    Airflow 3.3's UI shows the page of an external view at ``<base>/plugin/<url_route>`` and
    keeps the frame's own path after it (``<base>/plugin/liftbridge/<path of the page>``), so a
    link of that shape opens the frame at the page with its query.

    :param base_url: ``[api] base_url`` (``""``: unknown, the link is a path from the host's root).
    """
    base = base_url.rstrip("/")
    root = urlsplit(base).path if base else ""
    page = f"{root}{URL_PREFIX}/"
    suffix = f"?{urlencode({k: v for k, v in query.items() if v})}" if any(query.values()) else ""
    return f"{base}/plugin/{URL_ROUTE}{page}{suffix}"
