"""Link faults on an external cluster (issue 59): the campaign strikes ``client-link``, ``broker-nats``
and ``broker-peers`` through the ``--cut-cmd`` / ``--heal-cmd`` templates (``ExternalRig``), naming
the partition leader and the kind, and draws every kind for a broker cut there only when asked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServer

from .campaign import BROKER_CUT_TARGETS, LINK_KINDS, LINK_TARGETS, TARGETS, ExternalRig, draw
from .freezing import ExternalFreezable, match_brokers

pytestmark = [pytest.mark.timeout(120)]


def test_an_external_rig_strikes_link_targets_through_its_templates(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with DevServer(brokers=3) as server, LiftbridgeClient(server.addresses) as client:
        client.create_stream("s", "s", replication_factor=3)
        leader = client.fetch_metadata(["s"]).streams["s"].partitions[0].leader
        index = server.broker_ids.index(leader)
        brokers = match_brokers(server.addresses, client.fetch_metadata().brokers)
        cluster = ExternalFreezable(brokers, "true", "true")
        links = (*LINK_TARGETS, *BROKER_CUT_TARGETS)
        rig = ExternalRig(
            cluster,
            [],
            cut_cmd=f"echo cut {{target}} {{kind}} {{index}} {{id}} >> {log}",
            heal_cmd=f"echo heal >> {log}",
            link_targets=links,
        )
        assert rig.targets()[-3:] == links
        with rig:
            heal = rig.strike("broker-peers", "slow", "s", 0)
            heal()
            rig.strike("client-link", "cut-out", "s", 0)
        with pytest.raises(ValueError, match="unknown link kind 'kill'"):
            rig.strike("broker-nats", "kill", "s", 0)
    assert log.read_text().splitlines() == [
        f"cut broker-peers slow {index} {leader}",
        "heal",
        f"cut client-link cut-out {index} {leader}",
        "heal",  # as the run ended, whatever it left struck
    ]
    with pytest.raises(ValueError, match="needs both --cut-cmd and --heal-cmd"):
        ExternalRig(cluster, [], cut_cmd="true", link_targets=LINK_TARGETS)


def test_a_broker_cuts_kind_is_drawn_only_when_asked_for_and_changes_nothing_else() -> None:
    targets = (*TARGETS, *BROKER_CUT_TARGETS)
    drawn = set()
    for seed in range(300):
        total = draw(seed, targets=targets, link_kinds=LINK_KINDS)
        kinds = draw(seed, targets=targets, link_kinds=LINK_KINDS, broker_kinds=LINK_KINDS)
        assert dataclasses.replace(kinds, action=total.action) == total
        if total.target in BROKER_CUT_TARGETS:
            assert total.action == "cut"
            drawn.add(kinds.action)
        else:
            assert kinds == total
    assert drawn == set(LINK_KINDS)
