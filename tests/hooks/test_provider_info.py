"""Provider metadata: valid against Airflow's schema, and seen by Airflow as the package is installed."""

from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

from airflow_provider_liftbridge.connection_fields import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_liftbridge.get_provider_info import get_provider_info
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.triggers.base import LiftbridgeBaseTrigger
from tests.processes import run_child


def test_provider_info_matches_airflow_schema() -> None:
    import jsonschema
    from airflow.providers_manager import _create_provider_info_schema_validator

    _create_provider_info_schema_validator().validate(get_provider_info())
    jsonschema.Draft7Validator.check_schema(
        {"type": "object", "properties": {k: v["schema"] for k, v in CONN_FIELDS.items()}}
    )


def test_listed_modules_hold_the_classes() -> None:
    info = get_provider_info()
    found: dict[str, list[str]] = {}
    for section in ("hooks", "operators", "sensors", "triggers"):
        for module_name in info[section][0]["python-modules"]:
            module = importlib.import_module(module_name)
            found.setdefault(section, []).extend(module.__all__)
    assert {"LiftbridgeHook", "LiftbridgeAsyncHook"} <= set(found["hooks"])
    assert {
        "LiftbridgeCreateStreamOperator",
        "LiftbridgeDeleteStreamOperator",
        "LiftbridgePauseStreamOperator",
        "LiftbridgeSetStreamReadonlyOperator",
        "LiftbridgePublishOperator",
        "LiftbridgePublishFileOperator",
    } <= set(found["operators"])
    assert {"LiftbridgeOffsetSensor", "LiftbridgeAckSensor", "LiftbridgeMessageSensor"} <= set(found["sensors"])
    assert {"LiftbridgeOffsetTrigger", "LiftbridgeAckTrigger", "LiftbridgeMessageTrigger"} <= set(found["triggers"])
    trigger_module = importlib.import_module("airflow_provider_liftbridge.triggers.offset")
    assert issubclass(trigger_module.LiftbridgeOffsetTrigger, LiftbridgeBaseTrigger)


def test_providers_manager_reads_the_connection_form() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    try:  # Airflow 3.3 reads hooks through the task SDK's runtime manager (ProvidersManager.hooks warns)
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
    except ImportError:  # Airflow 3.2
        hooks = manager.hooks
    else:
        hooks = ProvidersManagerTaskRuntime().hooks
    hook = hooks["liftbridge"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_provider_liftbridge.hooks.base.LiftbridgeHook"
    assert hook.connection_testable
    widgets = {k: v for k, v in manager.connection_form_widgets.items() if k.startswith("extra__liftbridge__")}
    assert set(widgets) == {f"extra__liftbridge__{name}" for name in CONN_FIELDS}
    ack = widgets["extra__liftbridge__ack_policy"].field
    assert ack["schema"]["enum"] == ["leader", "all", "none"] and ack["value"] == "leader"
    behaviour = manager.field_behaviours["liftbridge"]
    assert behaviour["hidden_fields"] == UI_FIELD_BEHAVIOUR["hidden-fields"]
    assert behaviour["relabeling"] == {
        "host": "Brokers",
        "port": "Default broker port",
        "login": "NATS user",
        "password": "NATS password",
    }
    assert "used for brokers given without a port" in behaviour["placeholders"]["port"]
    # Airflow 3.3 shows no placeholder for extra fields: the example is in the help text.
    assert "e.g. nats://127.0.0.1:4222" in widgets["extra__liftbridge__nats_servers"].field["description"]
    assert widgets["extra__liftbridge__nats_token"].is_sensitive
    assert behaviour["placeholders"]["extra__liftbridge__nats_servers"] == "nats://127.0.0.1:4222"


def test_hook_field_behaviour_matches_the_declaration() -> None:
    behaviour = LiftbridgeHook.get_ui_field_behaviour()
    assert behaviour["hidden_fields"] == UI_FIELD_BEHAVIOUR["hidden-fields"]
    assert behaviour["placeholders"] == UI_FIELD_BEHAVIOUR["placeholders"]


@pytest.mark.timeout(120)
def test_airflow_cli_lists_the_provider() -> None:
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    result = run_child(
        [airflow, "providers", "get", "airflow-provider-liftbridge", "--full", "-o", "json"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (provider,) = json.loads(result.stdout[result.stdout.index("[") :])
    assert provider["package-name"] == "airflow-provider-liftbridge"
    assert provider["connection-types"][0]["connection-type"] == "liftbridge"
    for section in ("hooks", "operators", "sensors", "triggers"):
        assert provider[section][0]["python-modules"], section
    listing = run_child(
        [airflow, "providers", "list", "-o", "plain"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    assert "airflow-provider-liftbridge" in listing.stdout


def test_package_metadata_has_urls_license_and_notice() -> None:
    # Admin > Providers links to the "Documentation" project URL (read from the installed metadata).
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert {"Documentation", "Source", "Changelog"} <= set(project["urls"])
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE", "NOTICE"]
    assert "Apache License" in (root / "LICENSE").read_text()
    assert "api.proto" in (root / "NOTICE").read_text()
