"""The external-cluster hook of the frozen-broker scenarios (``freezing.py``): command templates
that name a broker, run with a real shell, and a scenario driven through them against a dev
cluster running as a process of its own, frozen with a real SIGSTOP (the dev server holds every
broker in one process, so all three freeze; ``scripts/frozen_external.sh`` runs every scenario
that way and through the server's control channel)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.types import BrokerInfo
from airflow_provider_liftbridge.devserver import DevServerProcess

from . import exactly_once_frozen as scenarios
from .freezing import Broker, ExternalFreezable, find_broker, match_brokers, run_command

pytestmark = [pytest.mark.timeout(120)]

BROKER = Broker(2, "broker-2", "10.0.0.7:9294")


def test_a_command_names_the_broker_and_leaves_other_braces_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_command(
        f"echo '{{index}} {{id}} {{address}} {{host}} {{port}}' | awk '{{print $2, $5}}' > {out}", BROKER, "freeze"
    )
    assert out.read_text() == "broker-2 9294\n"


def test_a_failing_command_says_which_and_what_to_fix() -> None:
    with pytest.raises(RuntimeError) as info:
        run_command("echo 'no such container liftbridge-{index}' >&2; exit 3", BROKER, "thaw")
    message = str(info.value)
    assert "exited with 3" in message and "no such container liftbridge-2" in message
    assert "--thaw-cmd" in message and "broker-2" in message


def test_brokers_are_matched_to_metadata_by_address_then_by_port() -> None:
    listed = [BrokerInfo("a", "10.0.0.5", 9292, 1, 1), BrokerInfo("b", "lb-1.internal", 9293, 1, 0)]
    brokers = match_brokers(["10.0.0.5:9292", "lb-1:9293"], listed)
    assert [(b.index, b.id) for b in brokers] == [(0, "a"), (1, "b")]
    assert [find_broker(v, brokers) for v in ("1", "a", "lb-1:9293")] == [1, 0, 1]
    with pytest.raises(LookupError, match="matches no broker the cluster reports"):
        match_brokers(["10.0.0.9:9999"], listed)
    with pytest.raises(LookupError, match="names no broker"):
        find_broker("c", brokers)


def test_a_frozen_broker_scenario_drives_a_server_process_through_shell_commands() -> None:
    with (
        tempfile.TemporaryDirectory() as data,
        DevServerProcess(data, brokers=3, timings=scenarios.DEV_TIMINGS) as proc,
    ):
        with LiftbridgeClient(proc.addresses) as client:
            brokers = match_brokers(proc.addresses, client.fetch_metadata().brokers)
        cluster = ExternalFreezable(brokers, f"kill -STOP {proc.pid}", f"kill -CONT {proc.pid}")
        figures = scenarios.frozen_broker("follower", occ=False, cluster=cluster)
    assert (figures.lost, figures.duplicated, figures.in_stream) == (0, 0, figures.sent), figures
    assert figures.scenario.startswith("external cluster: follower frozen"), figures
