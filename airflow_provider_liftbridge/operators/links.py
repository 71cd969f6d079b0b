"""Extra links of the reading and publishing operators: buttons on a task instance's page that
open the Liftbridge view (``docs/ui.md``) at the task's stream ("Liftbridge stream") or at its
pipeline ("Liftbridge pipeline"), as Airflow's Google providers link to their consoles.

Airflow 3 computes a link in the task process when the task ends and keeps it in an XCom; the
UI shows a button only when the link is not empty. A link is empty where the view is not
installed: the ``liftbridge_ui`` plugin is not registered in this installation (its
``airflow.plugins`` entry point), or Airflow is older than 3.1 (no plugin views). The address is
built from ``[api] base_url``, so it stays under Airflow's path prefix.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from airflow.sdk import BaseOperatorLink

from airflow_provider_liftbridge.ui.paths import view_url

__all__ = ["PIPELINE_LINK", "STREAM_LINK", "LiftbridgePipelineLink", "LiftbridgeStreamLink", "view_installed"]

#: The buttons' names.
STREAM_LINK = "Liftbridge stream"
PIPELINE_LINK = "Liftbridge pipeline"
#: The view's plugin, as registered in ``pyproject.toml``.
_PLUGIN_ENTRY_POINT = "airflow_provider_liftbridge.ui.plugin:LiftbridgeUiPlugin"


@cache
def view_installed() -> bool:
    """The Liftbridge view is registered with this Airflow (3.1+, the plugin's entry point present)."""
    from airflow.sdk import __version__ as sdk_version  # the task SDK 1.1+ comes with Airflow 3.1+

    major, minor = (int(part) for part in sdk_version.split(".")[:2])
    if (major, minor) < (1, 1):
        return False
    return any(ep.value == _PLUGIN_ENTRY_POINT for ep in entry_points(group="airflow.plugins"))


def _base_url() -> str:
    from airflow.sdk.configuration import conf

    return str(conf.get("api", "base_url", fallback="") or "")


def _conn(operator: Any) -> str:
    return str(getattr(operator, "liftbridge_conn_id", "") or "")


class LiftbridgeStreamLink(BaseOperatorLink):
    """Opens the view's message browser at the task's stream."""

    name = STREAM_LINK

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The view at ``operator.stream`` (``""`` where the view is not installed)."""
        stream = getattr(operator, "stream", None)
        if not view_installed() or not isinstance(stream, str) or not stream:
            return ""
        return view_url(_base_url(), conn=_conn(operator), tab="browse", stream=stream)


class LiftbridgePipelineLink(BaseOperatorLink):
    """Opens the view's pipelines tab at the task's pipeline (its DAG and task)."""

    name = PIPELINE_LINK

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The view at ``<dag_id>.<task_id>`` (``""`` where the view is not installed)."""
        if not view_installed():
            return ""
        return view_url(
            _base_url(), conn=_conn(operator), tab="pipelines", pipeline=f"{ti_key.dag_id}.{ti_key.task_id}"
        )
