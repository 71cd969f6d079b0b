"""An external campaign run waits for a cluster that takes no metadata change, and a failing
``--metadata-leader-cmd`` costs one run, not the campaign (issue 59; seeds 59906-59910 in
docs/reliability.md). The dev cluster stands in for the external one: its metadata leader, stalled
under an election time-out longer than the test, hangs every CreateStream as a Liftbridge without a
metadata leader does."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from tests.conftest import EXTERNAL_BROKERS

from .campaign import ExternalRig, Schedule, await_metadata, run
from .freezing import Broker, ExternalFreezable, MetadataLeaderUnknown, match_brokers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fault_campaign  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]

#: Longer than any test here: a stalled metadata leader stays the leader until it is resumed.
NO_ELECTION = ClusterTimings.fast(metadata_election_timeout=3600.0)


@pytest.fixture
def server() -> Iterator[DevServer]:
    if EXTERNAL_BROKERS:
        pytest.skip("needs a 3-broker dev server of its own")
    with DevServer(brokers=3, timings=NO_ELECTION) as srv:
        yield srv


def _cluster(server: DevServer, **kwargs: object) -> ExternalFreezable:
    with LiftbridgeClient(server.addresses, timeout=5.0) as client:
        brokers = match_brokers(server.addresses, client.fetch_metadata().brokers)
    return ExternalFreezable(brokers, "true", "true", **kwargs)  # type: ignore[arg-type]


def _schedule(seed: int, target: str) -> Schedule:
    return Schedule(seed, "grpc", target, "stop", "before", 0.5, 0.3, 0.0, 20, 1)


def _wait_through_a_stall(server: DevServer, index: int) -> list[str]:
    """Stall broker ``index``, wait for the cluster in a thread until it says it waits, check it is
    still waiting, resume the broker, and return what the wait said once it has returned."""
    lines: list[str] = []
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            await_metadata(server.addresses, within=240.0, say=lines.append)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failed.append(exc)

    server.stall_broker(index)
    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        deadline = time.monotonic() + 120.0
        while not lines and waiter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lines and "takes no metadata change or ack-ALL publish" in lines[0]
        assert "waiting up to 240 s" in lines[0]
        assert waiter.is_alive()  # still waiting
    finally:
        server.resume_broker(index)
    waiter.join(120.0)
    assert not waiter.is_alive() and failed == []
    assert "took a metadata change and an ack-ALL publish again after" in lines[-1]
    with LiftbridgeClient(server.addresses, timeout=5.0) as client:
        assert not [s for s in client.fetch_metadata().streams if s.startswith("campaign-probe-")]
    return lines


def test_the_wait_lasts_until_the_cluster_creates_a_stream_again(server: DevServer) -> None:
    _wait_through_a_stall(server, server.metadata_leader)  # the probe stream cannot be created


def test_the_wait_lasts_until_the_cluster_acknowledges_a_probe_record_with_ack_all() -> None:
    # Seeds 59939-59941: the cluster took CreateStream, but a run's set-up records got no ALL ack.
    # Here a stalled follower leaves the ISR below its minimum (3), so nothing commits: before the
    # probe published, the wait returned at once.
    if EXTERNAL_BROKERS:
        pytest.skip("needs a 3-broker dev server of its own")
    with DevServer(
        brokers=3, timings=ClusterTimings.fast(metadata_election_timeout=3600.0, min_insync_replicas=3)
    ) as srv:
        _wait_through_a_stall(srv, next(i for i in range(3) if i != srv.metadata_leader))


def test_a_run_on_a_cluster_that_never_got_a_metadata_leader_is_not_judged(server: DevServer) -> None:
    rig = ExternalRig(_cluster(server), [], metadata_within=1.0)
    leader = server.metadata_leader
    server.stall_broker(leader)
    try:
        verdict = run(_schedule(59906, "leader"), rig)
    finally:
        server.resume_broker(leader)
    assert verdict.outcome == "unsettled" and verdict.violations == []
    assert verdict.unsettled.startswith("seed 59906: the cluster had no metadata leader for ")


def test_the_leader_command_is_tried_again_until_it_names_a_broker(tmp_path: Path) -> None:
    flag = tmp_path / "tried"
    command = f"if [ -e {flag} ]; then echo b; else touch {flag}; echo not yet >&2; exit 3; fi"
    brokers = [Broker(0, "a", "h:1"), Broker(1, "b", "h:2")]
    assert ExternalFreezable(brokers, "true", "true", leader_cmd=command, leader_within=60.0).metadata_leader == 1
    for failing, said in (("false", "exited with 1; stderr: ''"), ("echo gone >&2; exit 3", "stderr: 'gone'")):
        cluster = ExternalFreezable(brokers, "true", "true", leader_cmd=failing, leader_within=0.5)
        with pytest.raises(MetadataLeaderUnknown, match=rf"failed \d+ time\(s\) in 0.5 s; last: .*{said}"):
            _ = cluster.metadata_leader


def test_a_failing_leader_command_costs_its_run_and_the_campaign_goes_on(
    server: DevServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = fault_campaign.main(
        [
            *("--brokers", ",".join(server.addresses), "--freeze-cmd", "true", "--thaw-cmd", "true"),
            *("--metadata-leader-cmd", "echo no leader yet >&2; exit 3", "--ready-within", "1"),
            *("--targets", "metadata-leader,leader", "--paths", "grpc", "--runs", "2", "--base-seed", "59951"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    # 59951 stops the partition leader (a no-op "true" here) and is judged; 59952 the metadata leader
    assert "2 runs, 0 with violations, 1 not judged" in out
    assert "not judged: seed 59952: --metadata-leader-cmd" in out
    assert "exited with 3; stderr: 'no leader yet'" in out
