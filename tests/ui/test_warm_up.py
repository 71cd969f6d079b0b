"""The view's warm-up (``ui/plugin.py``, ``WarmUpMiddleware``): when an app with the plugin's root
middleware starts (the ASGI lifespan, as the api-server runs it), the view's app is imported in
the background, so the first click on Browse → Liftbridge does not wait for it; requests pass
through untouched; without a lifespan (a task process builds no app) nothing is imported."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

from tests.airflow_support import REPO
from tests.processes import run_child


def test_the_views_app_is_imported_when_the_server_starts(tmp_path: Any) -> None:
    script = textwrap.dedent(
        """
        import sys, threading
        from fastapi import FastAPI
        from fastapi.testclient import TestClient
        from airflow_provider_liftbridge.ui.plugin import LiftbridgeUiPlugin

        def loaded():
            module = sys.modules.get("airflow_provider_liftbridge.ui.api")
            return module is not None and hasattr(module, "app")  # imported whole, not begun

        root = FastAPI()
        for entry in LiftbridgeUiPlugin.fastapi_root_middlewares:  # as Airflow's init_plugins adds them
            root.add_middleware(entry["middleware"], *entry.get("args", []), **entry.get("kwargs", {}))

        @root.get("/ping")
        def ping():
            return {"pong": True}

        print("NO LIFESPAN", TestClient(root).get("/ping").json(), loaded())
        with TestClient(root) as client:  # runs the lifespan, as uvicorn does
            print("PASSED", client.get("/ping").json())
            for thread in threading.enumerate():
                if thread.name == "liftbridge-view-warm-up":
                    thread.join()
        print("WARM", loaded(), "MIDDLEWARES", len(LiftbridgeUiPlugin.fastapi_root_middlewares))
        """
    )
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = str(REPO)  # this checkout, whatever an editable install points at
    done = run_child([sys.executable, "-P", "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NO LIFESPAN {'pong': True} False" in done.stdout, done.stdout[-2000:]
    assert "PASSED {'pong': True}" in done.stdout and "WARM True MIDDLEWARES 1" in done.stdout, done.stdout[-2000:]
