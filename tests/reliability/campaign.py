"""The randomized fault campaign (issue 36): faults and moments drawn from a seed, every run judged
by one checker that reads every partition back.

A run (:func:`run`) is one :class:`Schedule`, drawn by :func:`draw` from its seed alone, so a seed
reproduces a run. It publishes (or reads) on one path while one fault strikes one target:

- paths: ``bulk-nats`` (``publish_many`` over NATS), ``grpc`` (``publish_many`` pipelined over
  PublishAsync), ``exactly-once`` and ``exactly-once-occ`` (``ExactlyOncePublisher`` over NATS,
  on a stream without / with optimistic concurrency control, tried again with the same producer
  id after a failure, as Airflow retries a task), ``consume`` (the reading operators' machinery,
  ``RangePlanner`` and ``read_plan``, retried with the same run id after a failure),
  ``consume-operator`` and ``archive`` (``LiftbridgeConsumeOperator`` and
  ``LiftbridgeStreamToFileOperator`` in a real DAG run, ``dag.test()`` in a process of its own,
  retried by Airflow: ``dags/reliability_campaign.py``); ``consume-interval`` (``IntervalPlanner``
  and ``read_plan``: interval_path.py) is drawn only when asked for (``--paths``), so the seeds of
  the default paths keep their schedules; so are ``consume-operator-interval`` and
  ``archive-interval`` (the two operators with ``read=DataInterval(...)`` in a real DAG run, as the
  operator paths; the archive into a time layout, ``sec={timestamp:%H%M%S}``). Their stream is
  filled in three rounds, before, inside and after the interval (real reception timestamps, the
  interval's bounds taken between the rounds);
- targets: the client's NATS node, the brokers' NATS node (the partition leader's), a partition
  leader, a follower, the metadata leader, the whole cluster; only when asked for, the client's
  link (``client-link``, :data:`LINK_TARGETS`) and the partition leader cut off from NATS or from
  its peers while the client still reaches it (:data:`BROKER_CUT_TARGETS`, a minority leader);
- actions: ``kill`` (SIGKILL, back ``down`` seconds later) or ``stop`` (SIGSTOP, SIGCONT ``down``
  seconds later);
- moments: ``before`` the call, ``during`` it (when a random fraction of the records is stored),
  ``recovery`` (a second strike shortly after the first one healed, while the client recovers),
  ``after`` it returned (what was acknowledged must survive).

On the dev cluster the NATS nodes are three real ``nats-server`` processes in one NATS cluster
(the brokers on node 0, the client on node 1, discovering the others); the brokers are a
three-broker dev server in a process of its own (``DevServerProcess``), whose kill and stop are
its fault hooks (a model of SIGKILL and SIGSTOP, docs/devserver.md). Not in this process: a
cluster sharing the test's interpreter stands still whenever it does (a full garbage collection of
a worker's heap took up to 4.6 s on a busy machine), and in a busy whole-suite run of issue 45
every follower of every leader dropped from the ISR in the same 20 ms; real brokers never stall
together with their client. Against an external cluster (``LIFTBRIDGE_TEST_BROKERS``)
the brokers are frozen and thawed with the ``--freeze-cmd`` / ``--thaw-cmd`` templates
(``freezing.py``), and killed and restarted with ``--kill-cmd`` / ``--restart-cmd`` when given;
the NATS targets are not drawn there (this process does not own the NATS nodes).

The checker (:func:`check`) holds every path to the same invariants:

- a call that returned success has every one of its records in the stream;
- every ack, returned or carried by a ``PublishError``, points at a stored message with the
  record's payload;
- a ``PublishError`` accounts for every record (an ack or a typed error each, never both), and a
  record it names ``NotSentError`` is not in the stream; a record it names ``AckedThenLostError``
  (acknowledged, then lost by the partition before the call raised) counts as not acknowledged,
  and is not in the stream either;
- exactly-once never stores a record twice (the retries included), and after its retries every
  record is in the stream; a try that raised a ``ReplacedHistoryError`` (Liftbridge replaced the
  partition's history) is not tried again, as the operators fail such a task without retries,
  and what it stored twice or lost of the records it counted as stored may not exceed what it
  reported (``twice``, ``missing``);
- a consume run never skips a message: every offset up to the planned end was handed to the
  function, and the next run has nothing left;
- the archive holds each message exactly once, and the position is at the end;
- an interval read by an operator hands over every message whose stored timestamp is in the
  interval and none outside it; archived by interval, each of them is in the archive exactly once
  (across retries), in the folder the layout names for its timestamp, and nothing outside it is.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_liftbridge.client import (
    AckedThenLostError,
    AckPolicy,
    AckTimeoutError,
    LiftbridgeClient,
    LiftbridgeError,
    NotSentError,
    PublishError,
    PublishOptions,
    Record,
    StartPosition,
    StopPosition,
    UnaccountedRecordError,
)
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher, ReplacedHistoryError
from airflow_provider_liftbridge.client.reading import RangePlanner, read_plan
from airflow_provider_liftbridge.client.types import PartitionInfo
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServerProcess
from tests.margins import bounded
from tests.netfaults import Link, link_unavailable
from tests.processes import nats_cluster, restart_nats, sigstop

from .freezing import ExternalFreezable, MetadataLeaderUnknown, run_command
from .interval_path import PATH as INTERVAL_PATH
from .interval_path import ends_again, interval_call

PATHS = ("bulk-nats", "grpc", "exactly-once", "exactly-once-occ", "consume", "consume-operator", "archive")
#: The operators reading by interval, in a real DAG run (not in :data:`PATHS`: drawn when asked for).
INTERVAL_OPERATOR_PATHS = ("consume-operator-interval", "archive-interval")
#: The paths drawn only when asked for (``--paths``), so the seeds of :data:`PATHS` keep their schedules.
EXTRA_PATHS = (INTERVAL_PATH, *INTERVAL_OPERATOR_PATHS)
#: The paths that read a stream filled before the run (the others publish during it).
READING_PATHS = ("consume", "consume-operator", "archive", *EXTRA_PATHS)
#: The folder layout of ``archive-interval``: one folder a second, so an interval spans several.
INTERVAL_LAYOUT = "sec={timestamp:%H%M%S}"
#: Cursor ids of the reading paths' positions.
POSITION_CURSORS = {"consume": "campaign", "consume-operator": "campaign-operator", "archive": "campaign-archive"}
TARGETS = ("client-nats", "leader-nats", "leader", "follower", "metadata-leader", "cluster")
NATS_TARGETS = ("client-nats", "leader-nats")
ACTIONS = ("kill", "stop")
#: Link faults, drawn only when asked for (``targets=`` with them, on ``DevRig(link_faults=True)``;
#: so a campaign without them draws every seed as before): ``client-link`` is every packet between
#: the client and the cluster (brokers and NATS), struck as the run's link kind (its action, one of
#: :data:`LINK_KINDS`) for its ``down`` seconds (:data:`LINK_DOWN`).
LINK_TARGETS = ("client-link",)
#: What a link fault does (``tests/netfaults.py``): ``cut`` drops every packet both ways, silently;
#: ``cut-in`` only the client's (to the cluster: requests and the client's TCP acks; the cluster's
#: replies pass), ``cut-out`` only the cluster's; ``slow`` lets 256 kbit/s through both ways, the
#: rest waiting up to 5 s in the queue; ``lossy`` lets 1 Mbit/s through both ways with a 6 KB queue
#: and drops the rest (this kernel has no ``netem``: a loss share that grows with the load). Only
#: ``cut`` is drawn unless more are asked for (``draw(link_kinds=...)``), so the link seeds drawn
#: before the other kinds keep their schedules.
LINK_KINDS = ("cut", "cut-in", "cut-out", "slow", "lossy")
#: A broker cut off while the client still reaches it (devserver/isolation.py), drawn only when
#: asked for (``targets=`` with them), so every earlier seed keeps its schedule: ``broker-nats`` cuts
#: the partition leader off from NATS, and so from its peers (Liftbridge's brokers talk to each
#: other only through NATS), ``broker-peers`` from its peers only (its NATS node cut from the
#: others), so it still appends what it is sent and commits none of it: a minority leader. The
#: action is the cut's kind (:data:`LINK_KINDS`: the dev server's ``isolation.KINDS``), ``cut``
#: unless more are asked for (``draw(broker_kinds=...)``, drawn last, so the broker-cut seeds
#: drawn before the kinds keep their schedules); the cut heals after the run's ``down`` seconds
#: (:data:`LINK_DOWN`).
BROKER_CUT_TARGETS = ("broker-nats", "broker-peers")
#: How long a link fault lasts, in seconds: up to past the client's keepalive bound (20 s), so
#: that some cuts are noticed as lost connections and not only ridden out by TCP's retransmits.
LINK_DOWN = (0.3, 30.0)
MOMENTS = ("before", "during", "recovery", "after")

#: The dev cluster's timings: leadership moves after 2 s, a lagging follower leaves the ISR after
#: 3 s, followers that lost NATS wait 1 s (Liftbridge: 15 s, 15 s, 10 s; shorter to keep runs short).
TIMINGS = ClusterTimings.fast(replica_max_leader_timeout=2.0, replica_max_lag_time=3.0, replica_max_idle_wait=1.0)
#: How long each record waits for its ack before the recovery logic takes over.
ACK_WAIT = 3.0
#: The same against an external cluster: Liftbridge's first ack-ALL commit on a new partition took
#: 9-10 s there (docs/reliability.md), so with ``ACK_WAIT`` most publishing runs raised an ack
#: time-out before their fault mattered, and the recovery paths were barely exercised.
EXTERNAL_ACK_WAIT = 15.0
#: Tries of an exactly-once publish or a consume run (Airflow's retries of the task).
TRIES = 4


@dataclass(frozen=True)
class Schedule:
    """One run of the campaign, drawn from :attr:`seed` alone."""

    seed: int
    path: str
    target: str
    action: str
    moment: str
    fraction: float  # of the records stored (read, for consume) when the fault strikes
    down: float  # seconds the fault lasts
    second_after: float  # seconds after the first heal the second strike comes (moment "recovery")
    records: int
    partitions: int

    def __str__(self) -> str:
        when = {
            "before": "before the call",
            "during": f"at {self.fraction:.0%} of the records",
            "recovery": f"at {self.fraction:.0%}, again {self.second_after:.1f} s after the heal",
            "after": "after the call returned",
        }[self.moment]
        return (
            f"seed {self.seed}: {self.path}, {self.records} records on {self.partitions} partition(s); "
            f"{self.action} {self.target} {when} for {self.down:.1f} s"
        )


def draw(
    seed: int,
    *,
    paths: Sequence[str] = PATHS,
    targets: Sequence[str] = TARGETS,
    actions: Sequence[str] = ACTIONS,
    link_kinds: Sequence[str] = LINK_KINDS[:1],
    broker_kinds: Sequence[str] = LINK_KINDS[:1],
) -> Schedule:
    """The schedule of ``seed``: every choice comes from ``random.Random(seed)``, in a fixed order
    (the same seed with the same choices to draw from gives the same schedule). A link target's
    action is its kind, drawn from ``link_kinds`` last, so the other choices are those drawn with
    any ``link_kinds``; a broker cut's likewise from ``broker_kinds``."""
    rng = random.Random(seed)
    path = rng.choice(list(paths))
    target = rng.choice(list(targets))
    action = rng.choice(list(actions))
    if target in LINK_TARGETS or target in BROKER_CUT_TARGETS:
        action = "cut"  # the action was drawn all the same, so the draws after it come as for any target
    moment = rng.choice(MOMENTS)
    records = {"bulk-nats": 50000, "grpc": 1500}.get(path, 3000 if path in READING_PATHS else 30000)
    fraction = rng.uniform(0.02, 0.9)
    down = rng.uniform(*(LINK_DOWN if target in LINK_TARGETS or target in BROKER_CUT_TARGETS else (0.3, 3.0)))
    second_after = rng.uniform(0.0, 1.5)
    partitions = rng.choice((1, 3))
    if target in LINK_TARGETS and len(link_kinds) > 1:
        action = rng.choice(list(link_kinds))
    if target in BROKER_CUT_TARGETS and len(broker_kinds) > 1:
        action = rng.choice(list(broker_kinds))
    return Schedule(
        seed=seed,
        path=path,
        target=target,
        action=action,
        moment=moment,
        fraction=fraction,
        down=down,
        second_after=second_after,
        records=records,
        partitions=partitions,
    )


# -- where faults strike -----------------------------------------------------------------------


def strike_link(link: Link, kind: str) -> None:
    """Strike ``link`` as :data:`LINK_KINDS` says ``kind`` does (the client is on the link's outer
    side, so its packets go ``in``).

    :raises ValueError: ``kind`` is not one of :data:`LINK_KINDS`.
    """
    if kind == "cut":
        link.cut()
    elif kind == "cut-in":
        link.cut("in")
    elif kind == "cut-out":
        link.cut("out")
    elif kind == "slow":
        link.slow("256kbit")
    elif kind == "lossy":
        link.lossy("1mbit", 6000)
    else:
        raise ValueError(f"unknown link kind {kind!r}; choose one of {', '.join(LINK_KINDS)}")


class DevRig:
    """Three ``nats-server`` processes in one NATS cluster and a three-broker dev cluster on
    node 0, in a process of its own; the client is given node 1 only and discovers the others
    from the cluster. With ``show_log`` the cluster's log goes to stdout at the end (pytest shows
    it beside a failed test: leader changes, ISR shrinks).

    With ``link_faults`` the cluster (nats-servers and brokers) runs in a network namespace of its
    own, reached only through a veth pair (``tests/netfaults.py``), so the ``client-link`` target
    can cut the client off silently.

    :raises RuntimeError: (on enter) ``link_faults`` where namespaces cannot be made (the message
        says why; see ``tests.netfaults.link_unavailable``).
    """

    external = False

    def __init__(self, show_log: bool = False, link_faults: bool = False) -> None:
        self.show_log = show_log
        self.link: Link | None = None
        if link_faults:
            why = link_unavailable()
            if why is not None:
                raise RuntimeError(f"link faults cannot be made here: {why}")
            self.link = Link()
        host, wrapper = (self.link.inside, self.link.wrapper()) if self.link else ("127.0.0.1", [])
        self._host, self._wrapper = host, wrapper
        self.nats = nats_cluster(3, host, wrapper)
        self.server: DevServerProcess | None = None
        self._data = Path(tempfile.mkdtemp(prefix="campaign-cluster-"))

    def __enter__(self) -> DevRig:
        try:
            for node in self.nats:
                node.start()
            self.server = DevServerProcess(
                self._data,
                brokers=3,
                host=self._host,
                nats_url=self.nats[0].url,
                timings=TIMINGS,
                wrapper=self._wrapper,
            ).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.link is not None:
            self.link.heal()  # before anything waits for the cluster through it
        for node in self.nats:
            with suppress(OSError, TypeError):
                os.kill(node.pid, signal.SIGCONT)  # type: ignore[arg-type]
        if self.server is not None:
            with suppress(Exception):
                for i in range(3):
                    self.server.resume_broker(i)
                    self.server.heal_broker(i)
            if self.show_log:
                with suppress(OSError):
                    tail = self.server.stderr_log.read_text()[-6000:]
                    print(f"-- the dev cluster's log (last 6,000 characters):\n{tail}")
            self.server.close()
        for node in self.nats:
            node.stop()
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self._data, ignore_errors=True)

    @property
    def addresses(self) -> list[str]:
        assert self.server is not None
        return self.server.addresses

    @property
    def client_nats(self) -> list[str]:
        return [self.nats[1].url]

    def strike(self, target: str, action: str, stream: str, partition: int) -> Callable[[], None]:
        """Strike ``target`` now; return what heals it."""
        server = self.server
        assert server is not None
        if target in LINK_TARGETS:
            link = self.link
            if link is None:
                raise RuntimeError(f"target {target!r} needs DevRig(link_faults=True)")
            strike_link(link, action)
            return link.heal
        if target in BROKER_CUT_TARGETS:
            index = self._broker_index("leader", stream, partition)
            if target == "broker-nats":
                server.cut_broker_from_nats(index, action)
            else:
                server.cut_broker_from_peers(index, action)
            return lambda: server.heal_broker(index)
        if target in NATS_TARGETS:
            node = self.nats[1 if target == "client-nats" else 0]
            if action == "kill":
                node.kill()
                return lambda: restart_nats(node)
            pid = node.pid
            assert pid is not None
            sigstop(pid)
            return lambda: os.kill(pid, signal.SIGCONT)
        if target == "cluster":
            assert action == "stop", "a killed cluster is restarted by restart_cluster (see _strike)"
            for i in range(3):
                server.stall_broker(i)

            def resume_all() -> None:
                for i in range(3):
                    server.resume_broker(i)

            return resume_all
        index = self._broker_index(target, stream, partition)
        if action == "kill":
            server.kill_broker(index)
            return lambda: server.start_broker(index)
        server.stall_broker(index)
        return lambda: server.resume_broker(index)

    def restart_cluster(self, down: float) -> None:
        assert self.server is not None
        self.server.restart_cluster(down=down)

    def _broker_index(self, target: str, stream: str, partition: int) -> int:
        server = self.server
        assert server is not None
        if target == "metadata-leader":
            return server.metadata_leader
        return server.broker_ids.index(replica_of(server.addresses, stream, partition, target))


#: How long a strike looks for its target (a partition's leader or follower) before the run is
#: reported as unsettled: a new stream reaches the brokers one by one (liftbridge-semantics.md),
#: and a partition whose leader just died lists none for a moment.
FIND_TARGET_WITHIN = 30.0


def replica_of(
    addresses: Sequence[str], stream: str, partition: int, target: str, within: float = FIND_TARGET_WITHIN
) -> str:
    """The id of the partition's ``"leader"``, or of a ``"follower"`` of it, looked for until every
    broker of ``addresses`` that answers lists the partition with the same leader (for ``within``
    s). Asking one broker is not enough: a deposed leader that has not applied the change yet still
    names itself (seed 59968 again, docs/reliability.md), and a strike aimed at "the leader" then
    hits it; :func:`read_back` waits for the same agreement.

    :raises Unsettled: not found in time (the message says what the brokers listed last).
    """
    with bounded("the partition's replica", within):
        deadline = time.monotonic() + within
        while True:
            named = _named_leaders(addresses, stream, [partition])[partition]
            if len(named) == 1 and "none" not in named:
                part = next(iter(named.values()))[1]
                followers = [r for r in part.replicas if r != part.leader]
                if target == "leader":
                    return part.leader
                if followers:
                    return followers[0]
            if time.monotonic() > deadline:
                seen = "; ".join(f"{' and '.join(who)}: {part}" for who, part in named.values()) or "no such stream"
                raise Unsettled(
                    f"the {target} of {stream!r} partition {partition} was not found in {within:g} s ({seen})"
                )
            time.sleep(0.5)


def _named_leaders(
    addresses: Sequence[str], stream: str, partitions: Sequence[int]
) -> dict[int, dict[str, tuple[list[str], PartitionInfo]]]:
    """By partition, each leader named by the brokers of ``addresses``: the brokers naming it and
    the partition as the first of them listed it ("none" for no leader). A broker that does not
    answer, or does not know the stream, is left out (a stopped one must not hold a caller back)."""
    named: dict[int, dict[str, tuple[list[str], PartitionInfo]]] = {p: {} for p in partitions}
    for address in addresses:
        with suppress(LiftbridgeError), LiftbridgeClient([address], timeout=2.0, max_retries=0) as one:
            listed = one.fetch_metadata([stream]).streams.get(stream)
            for p in partitions:
                part = listed.partitions.get(p) if listed is not None else None
                if part is not None:
                    named[p].setdefault(part.leader or "none", ([], part))[0].append(address)
    return named


#: How long an external run waits, before it starts, for the cluster to take a metadata change
#: again: after a long one-way cut of the NATS routes Liftbridge had no metadata leader for
#: minutes, and each next run's CreateStream timed out (seeds 59906-59910, docs/reliability.md).
METADATA_READY_WITHIN = 120.0


def _say(line: str) -> None:
    print(f"fault_campaign: {line}", flush=True)


#: The longest one probe publish waits for its ack-ALL (Liftbridge's first commit on a new
#: partition takes 9-10 s: liftbridge-semantics.md).
PROBE_ACK_WAIT = 30.0


def await_metadata(
    addresses: Sequence[str], within: float = METADATA_READY_WITHIN, say: Callable[[str], None] = _say
) -> None:
    """Return once the cluster creates a probe stream (replicated as the runs' streams are, on up to
    three brokers), acknowledges one record published to it with ack policy ALL, and deletes it,
    tried again for ``within`` s; ``say`` gets a line when the first try fails and one when a later
    try succeeds. A cluster can take a CreateStream and still commit nothing: after a one-way cut
    of the leader's NATS routes, three runs in a row could not get their set-up records
    acknowledged (seeds 59939-59941, docs/reliability.md).

    :raises Unsettled: no probe got that far in ``within`` s ("the cluster had no metadata leader
        for N s" when the stream was not created, "the cluster acknowledged no probe record for N
        s" when its publish failed; with the last error).
    """
    started = time.monotonic()
    probes: list[str] = []
    last = ""
    while True:
        probe = f"campaign-probe-{uuid.uuid4().hex[:8]}"
        probes.append(probe)
        created = False
        try:
            with LiftbridgeClient(list(addresses), timeout=5.0, max_retries=0) as prober:
                try:
                    prober.create_stream(probe, probe, replication_factor=min(3, len(addresses)))
                    created = True
                    left = within - (time.monotonic() - started)
                    wait = max(1.0, min(PROBE_ACK_WAIT, left))
                    prober.publish(probe, b"probe", ack_policy=AckPolicy.ALL, timeout=wait)
                finally:
                    for name in probes:  # a create that timed out may have been applied later
                        with suppress(LiftbridgeError):
                            prober.delete_stream(name)
        except LiftbridgeError as exc:
            waited = time.monotonic() - started
            if not last:
                say(
                    f"the cluster takes no metadata change or ack-ALL publish ({type(exc).__name__}); "
                    f"waiting up to {within:g} s"
                )
            last = f"{type(exc).__name__}: {exc}"
            if waited >= within:
                what = "acknowledged no probe record" if created else "had no metadata leader"
                raise Unsettled(f"the cluster {what} for {waited:.0f} s (last: {last})") from exc
            time.sleep(min(1.0, within - waited))
            continue
        if last:
            took = time.monotonic() - started
            say(f"the cluster took a metadata change and an ack-ALL publish again after {took:.0f} s")
        return


class ExternalRig:
    """An external cluster (``LIFTBRIDGE_TEST_BROKERS``): brokers stopped and continued with the
    freeze and thaw command templates, killed and started with the kill and start templates
    (``freezing.py`` has the placeholders). The NATS nodes are not this process's to strike, and
    "kill the cluster" is every broker's kill command, then every start command.

    ``link_targets`` (of :data:`LINK_TARGETS` and :data:`BROKER_CUT_TARGETS`) are struck with the
    ``cut_cmd`` template and healed with ``heal_cmd``: besides the broker placeholders (those of
    the partition leader, for every link target), ``{target}`` and ``{kind}`` (one of
    :data:`LINK_KINDS`), e.g. ``python -m tests.netfabric strike lbf {target} {kind} {index}`` on a
    cluster run in a ``tests/netfabric.py`` fabric. ``heal_cmd`` also runs as each run ends."""

    external = True

    def __init__(
        self,
        cluster: ExternalFreezable,
        nats: Sequence[str],
        kill_cmd: str = "",
        start_cmd: str = "",
        *,
        cut_cmd: str = "",
        heal_cmd: str = "",
        link_targets: Sequence[str] = (),
        metadata_within: float = METADATA_READY_WITHIN,
    ) -> None:
        self.cluster, self.kill_cmd, self.start_cmd = cluster, kill_cmd, start_cmd
        self.metadata_within = metadata_within
        self.client_nats = list(nats)
        self.cut_cmd, self.heal_cmd, self.link_targets = cut_cmd, heal_cmd, tuple(link_targets)
        if self.link_targets and not (cut_cmd and heal_cmd):
            raise ValueError(f"striking {', '.join(self.link_targets)} needs both --cut-cmd and --heal-cmd")

    def __enter__(self) -> ExternalRig:
        return self

    def await_ready(self) -> None:
        """Wait until the cluster takes metadata changes (:func:`await_metadata`).

        :raises Unsettled: it did not in ``metadata_within`` s."""
        await_metadata(self.addresses, self.metadata_within)

    def __exit__(self, *exc: object) -> None:
        if self.heal_cmd:  # whatever the run left struck
            run_command(self.heal_cmd, self.cluster.brokers[0], "heal")

    @property
    def addresses(self) -> list[str]:
        return self.cluster.addresses

    def targets(self) -> tuple[str, ...]:
        """What can be struck here: the brokers (and the metadata leader when it can be named)."""
        brokers = ("leader", "follower", "cluster")
        leader = ("metadata-leader",) if self.cluster.leader is not None or self.cluster.leader_cmd else ()
        return brokers + leader + self.link_targets

    def actions(self) -> tuple[str, ...]:
        return ACTIONS if self.kill_cmd and self.start_cmd else ("stop",)

    def strike(self, target: str, action: str, stream: str, partition: int) -> Callable[[], None]:
        if target in self.link_targets:
            return self._cut(target, action, stream, partition)
        if target == "cluster":
            indices = list(range(len(self.cluster.brokers)))
        elif target == "metadata-leader":
            try:
                leader = self.cluster.metadata_leader
            except MetadataLeaderUnknown as exc:  # the run is not judged; the campaign goes on
                raise Unsettled(str(exc)) from exc
            assert leader is not None
            indices = [leader]
        else:
            indices = [self.cluster.broker_ids.index(replica_of(self.addresses, stream, partition, target))]
        cluster = self.cluster
        down, up = (self.kill_cmd, self.start_cmd) if action == "kill" else (cluster.freeze_cmd, cluster.thaw_cmd)
        for i in indices:
            run_command(down, self.cluster.brokers[i], "kill" if action == "kill" else "freeze")

        def heal() -> None:
            for i in indices:
                run_command(up, self.cluster.brokers[i], "start" if action == "kill" else "thaw")

        return heal

    def restart_cluster(self, down: float) -> None:
        heal = self.strike("cluster", "kill", "", 0)
        time.sleep(down)
        heal()

    def _cut(self, target: str, kind: str, stream: str, partition: int) -> Callable[[], None]:
        """Strike a link target as ``kind`` through ``cut_cmd``; return what heals it."""
        if kind not in LINK_KINDS:
            raise ValueError(f"unknown link kind {kind!r}; choose one of {', '.join(LINK_KINDS)}")
        leader = self.cluster.brokers[
            self.cluster.broker_ids.index(replica_of(self.addresses, stream, partition, "leader"))
        ]
        command = self.cut_cmd.replace("{target}", target).replace("{kind}", kind)
        run_command(command, leader, "cut")
        return lambda: run_command(self.heal_cmd, leader, "heal")


# -- what a run did ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the path's calls did: per try, the acks (or the error) and what was handed over."""

    records: list[Record]
    acks: list[Any] | None = None  # of the last try that returned
    errors: list[BaseException] = field(default_factory=list)  # each try's failure, in order
    written: int | None = None  # exactly-once: written + skipped of the last try that returned
    consumed: list[tuple[int, int, bytes]] = field(default_factory=list)  # consume: (partition, offset, value)
    planned: dict[int, int] = field(default_factory=dict)  # reading: partition -> end (exclusive)
    left_after: int | None = None  # reading: offsets a next run would still read
    archived: Counter[tuple[int, int]] | None = None  # archive: (partition, offset) -> rows in the files
    folders: dict[tuple[int, int], set[str]] = field(default_factory=dict)  # archive-interval: where each row is
    interval: tuple[int, int] | None = None  # interval operator paths: [start, end) in ns since the epoch
    inside: int = 0  # interval operator paths: the records published inside the interval
    progress_of: Callable[[], int] | None = None  # interval operator paths: rows handed over / archived so far
    finished: bool = False  # operator paths: the DAG run succeeded
    progress_cursor: str = ""  # consume-interval: the interval's progress cursor
    struck: str = ""  # when the fault actually struck


@dataclass
class Verdict:
    """One run: its schedule, what happened, and the invariants it broke."""

    schedule: Schedule
    outcome: str
    violations: list[str]
    seconds: float
    struck: str
    unsettled: str = ""  # why the run could not be judged (Unsettled); empty when it was


def _records(schedule: Schedule, run: str) -> list[Record]:
    return [Record(f"{run}-{i:06d}".encode(), partition=i % schedule.partitions) for i in range(schedule.records)]


def read_back(addresses: Sequence[str], stream: str, partitions: int, within: float = 90.0) -> list[Any]:
    """Every message of ``stream``, once the cluster answers again and every partition has
    committed what its leader holds, and every broker that answers names the same leader for each
    partition (tried for ``within`` s). After a full restart a partition's high watermark reads -1
    for a while although its log holds messages (liftbridge-semantics.md): reading then would see
    an empty stream. A deposed leader that has not applied the leader change yet still names itself
    and serves its own, shorter, committed log (seed 59968 again, docs/reliability.md): reading
    from it would miss what the new leader committed.

    :raises Unsettled: the stream could not be read whole within ``within`` s (a partition kept
        committing less than its leader holds, or no broker would lead it); the error names the
        last state seen of every partition.
    """
    with bounded("the read-back settled", within):
        deadline = time.monotonic() + within
        while True:
            try:
                named = _named_leaders(addresses, stream, range(partitions))
                disagreement = _disagreement(named)
                if disagreement:
                    raise _NotSettled(disagreement)
                # Read through the brokers that named the leader, never one left out: a deposed
                # leader whose first answer came too late answers the next at once, naming itself,
                # and serves its own log (seed 59720, docs/reliability.md).
                answered = [a for a in addresses if any(a in who for by in named.values() for who, _ in by.values())]
                if not answered:
                    raise _NotSettled("no broker answered with the stream")
                with LiftbridgeClient(answered, timeout=5.0, max_retries=8) as reader:
                    out: list[Any] = []
                    for p in range(partitions):
                        info = reader.fetch_partition_metadata(stream, p)
                        if info.high_watermark < info.newest_offset:
                            raise _NotSettled(
                                f"partition {p}: committed to {info.high_watermark} of {info.newest_offset}"
                            )
                        if info.high_watermark < 0:
                            continue
                        whole = reader.subscribe(
                            stream, partition=p, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST
                        )
                        out += list(whole)
                    return out
            except (LiftbridgeError, _NotSettled) as exc:
                if time.monotonic() > deadline:
                    raise Unsettled(
                        f"the read-back did not settle in {within:g} s ({type(exc).__name__}: {exc}); "
                        f"partitions: {partition_states(addresses, stream, partitions)}"
                    ) from exc
                time.sleep(0.5)


def leaders_disagree(addresses: Sequence[str], stream: str, partitions: int) -> str:
    """Empty when every broker of ``addresses`` that answers names the same leader for each
    partition of ``stream``; else which brokers name which leader (a broker that does not answer,
    or does not know the stream, is left out: a stopped one must not hold the read back)."""
    return _disagreement(_named_leaders(addresses, stream, range(partitions)))


def _disagreement(named: dict[int, dict[str, tuple[list[str], PartitionInfo]]]) -> str:
    """Which brokers name which leader, for each partition that has more than one (else empty)."""
    return "; ".join(
        f"partition {p}: " + ", ".join(f"{' and '.join(who)} name {leader}" for leader, (who, _) in sorted(by.items()))
        for p, by in named.items()
        if len(by) > 1
    )


class _NotSettled(Exception):
    """A partition has not committed everything its leader holds yet."""


class Unsettled(Exception):
    """What a run needed to judge it (the stream read back whole, a strike's target found) could
    not be had in time: the run is reported with this, not judged, and the campaign goes on."""


def partition_states(addresses: Sequence[str], stream: str, partitions: int) -> str:
    """Each partition's state as the cluster reports it now (for a report; never raises)."""
    states = []
    with LiftbridgeClient(list(addresses), timeout=2.0, max_retries=1) as looker:
        try:
            listed = looker.fetch_metadata([stream]).streams.get(stream)
        except LiftbridgeError as exc:
            return f"metadata unavailable ({type(exc).__name__}: {exc})"
        for p in range(partitions):
            part = listed.partitions.get(p) if listed is not None else None
            if part is None:
                states.append(f"{p}: not listed")
                continue
            try:
                info = looker.fetch_partition_metadata(stream, p)
                marks = f"hw {info.high_watermark}, newest {info.newest_offset}"
            except LiftbridgeError as exc:
                marks = f"leader does not answer ({type(exc).__name__})"
            states.append(f"{p}: leader {part.leader}, isr {sorted(part.isr)}, {marks}")
    return "; ".join(states)


def failure_summary(exc: BaseException) -> str:
    """One failure of a path's call as a report line: its class, and for a :class:`PublishError`
    its cause and what became of the records (acked, timed out, not sent, other errors)."""
    if not isinstance(exc, PublishError):
        return type(exc).__name__
    kinds = Counter(type(e).__name__ for e in exc.errors.values())
    timed_out = sum(isinstance(e, AckTimeoutError) for e in exc.errors.values())
    not_sent = sum(isinstance(e, NotSentError) for e in exc.errors.values())
    lost = sum(isinstance(e, AckedThenLostError) for e in exc.errors.values())
    cause = exc.__cause__ or exc.__context__
    causes = ", ".join(f"{name} x{n}" for name, n in sorted(kinds.items())) or "no record error"
    if cause is not None:
        causes += f"; cause {type(cause).__name__}"
    return (
        f"PublishError({causes}: {exc.acked} of {len(exc.acks)} acked, {timed_out} timed out, "
        f"{not_sent} not sent{f', {lost} lost after their ack' if lost else ''}, "
        f"records {exc.start}..{exc.start + len(exc.acks) - 1})"
    )


def check(schedule: Schedule, outcome: Outcome, stored: Sequence[Any]) -> list[str]:
    """The invariants (module docstring) that ``outcome`` breaks, given every stored message."""
    bad: list[str] = []
    values = [r.value for r in outcome.records]
    wanted = set(values)
    seen = Counter(m.value for m in stored if m.value in wanted)
    at = {(m.partition, m.offset): m.value for m in stored}
    lost = sum(1 for v in values if not seen[v])
    dup = sum(c - 1 for c in seen.values() if c > 1)
    for exc in outcome.errors:
        if isinstance(exc, PublishError):
            bad += _contract_violations(exc, outcome.records, at, seen)
    if schedule.path in ("bulk-nats", "grpc"):
        if outcome.acks is not None:
            if len(outcome.acks) != len(values):
                bad.append(f"returned {len(outcome.acks)} acks for {len(values)} records")
            if lost:
                bad.append(f"returned success, but {lost} record(s) are not in the stream")
            bad += _ack_violations(outcome.acks, outcome.records, at)
    elif schedule.path.startswith("exactly-once"):
        replaced = _replaced_history(outcome)
        if replaced is None:
            if dup:
                bad.append(f"{dup} record(s) stored more than once")
        else:
            bad += _beyond_reported(replaced, len(values), lost, dup)
        if outcome.written is not None:
            if outcome.written != len(values):
                bad.append(f"the last try accounts for {outcome.written} of {len(values)} records")
            if lost:
                bad.append(f"returned success, but {lost} record(s) are not in the stream")
    elif schedule.path in INTERVAL_OPERATOR_PATHS:
        bad += _interval_violations(schedule, outcome, stored)
    elif schedule.path == "archive":
        if outcome.archived is not None:
            missing = [(p, o) for p, end in outcome.planned.items() for o in range(end) if not outcome.archived[(p, o)]]
            twice = [key for key, c in outcome.archived.items() if c > 1]
            if missing:
                bad.append(f"{len(missing)} message(s) missing from the archive, e.g. {missing[:3]}")
            if twice:
                bad.append(f"{len(twice)} message(s) in the archive more than once, e.g. {twice[:3]}")
            if outcome.left_after:
                bad.append(f"the position stops {outcome.left_after} offset(s) short of the end")
    elif schedule.path in ("consume", "consume-operator", INTERVAL_PATH):
        handed = {(p, o) for p, o, _ in outcome.consumed}
        skipped = [(p, o) for p, end in outcome.planned.items() for o in range(end) if (p, o) not in handed]
        if outcome.left_after is not None and skipped:
            bad.append(f"{len(skipped)} message(s) never handed to the function, e.g. {skipped[:3]}")
        wrong = [(p, o) for p, o, v in outcome.consumed if v is not None and at.get((p, o), v) != v]
        if wrong:
            bad.append(f"{len(wrong)} message(s) handed over with a value other than stored, e.g. {wrong[:3]}")
        if outcome.left_after and schedule.path == INTERVAL_PATH:
            bad.append(f"a second look at the interval ends elsewhere on {outcome.left_after} partition(s)")
        elif outcome.left_after:
            bad.append(f"a next run would read {outcome.left_after} offset(s) the finished run had planned")
    return bad


def _replaced_history(outcome: Outcome) -> ReplacedHistoryError | None:
    """The replaced history the exactly-once path's last try raised (after which nothing was
    tried again), or ``None`` when the path returned or ended otherwise."""
    last = outcome.errors[-1] if outcome.errors and outcome.written is None else None
    return last if isinstance(last, ReplacedHistoryError) else None


def _beyond_reported(exc: ReplacedHistoryError, records: int, lost: int, dup: int) -> list[str]:
    """What a run that ended in ``exc`` stored twice or lost beyond what ``exc`` reported: the
    copies stored twice must be at most its ``twice``, and the records it counted as stored
    (written or skipped) that are not in the stream at most its ``missing``. Records it never
    counted (not sent, or not acknowledged) may be missing: the failure said so."""
    bad: list[str] = []
    if dup > exc.twice:
        bad.append(f"{dup} record(s) stored more than once, {type(exc).__name__} reported {exc.twice}")
    counted = min(exc.result.written + exc.result.skipped, records)
    gone = counted - (records - lost)  # at least this many of the records it counted as stored
    if gone > exc.missing:
        bad.append(
            f"at least {gone} record(s) counted as stored are not in the stream, {type(exc).__name__} reported "
            f"{exc.missing}"
        )
    return bad


def _contract_violations(
    exc: PublishError, records: Sequence[Record], at: dict[Any, bytes], seen: Counter[bytes]
) -> list[str]:
    bad: list[str] = []
    n = len(exc.acks)
    start = exc.start
    unnamed = [i for i in range(n) if exc.acks[i] is None and i not in exc.errors]
    if unnamed:
        bad.append(f"PublishError leaves {len(unnamed)} record(s) without an ack or an error, e.g. {unnamed[:3]}")
    if any(isinstance(e, UnaccountedRecordError) for e in exc.errors.values()):
        bad.append("the publish contract caught records the engine did not account for")
    stored_not_sent = [
        i for i, e in exc.errors.items() if isinstance(e, NotSentError) and seen[records[start + i].value]
    ]
    if stored_not_sent:
        bad.append(f"{len(stored_not_sent)} record(s) named NotSentError are in the stream, e.g. {stored_not_sent[:3]}")
    both = [i for i in exc.errors if 0 <= i < n and exc.acks[i] is not None]
    if both:
        bad.append(f"PublishError gives {len(both)} record(s) an ack and an error, e.g. {both[:3]}")
    # A record reported lost after its ack has no ack any more (so _ack_violations skips it); one
    # that is in the stream all the same was a false alarm, which invites a duplicate.
    stored_lost = [
        i for i, e in exc.errors.items() if isinstance(e, AckedThenLostError) and seen[records[start + i].value]
    ]
    if stored_lost:
        bad.append(f"{len(stored_lost)} record(s) named AckedThenLostError are in the stream, e.g. {stored_lost[:3]}")
    bad += _ack_violations(list(exc.acks), records[start : start + n], at)
    return bad


def _ack_violations(acks: Sequence[Any], records: Sequence[Record], at: dict[Any, bytes]) -> list[str]:
    wrong = [
        i for i, ack in enumerate(acks) if ack is not None and at.get((ack.partition, ack.offset)) != records[i].value
    ]
    return [f"{len(wrong)} ack(s) point at no stored record with that payload, e.g. {wrong[:3]}"] if wrong else []


# -- one run -----------------------------------------------------------------------------------


#: How long a run's call may take before the run is reported as hung.
CALL_BOUND = 240.0


def _reached(progress: Callable[[], int], count: int, worker: threading.Thread) -> bool:
    """Wait until ``progress()`` reaches ``count`` (True), or the call ends first (False).

    Bounded by the call's own bound: an operator's run starts Airflow in a process of its own
    before it reads anything, which on a busy machine alone took 53 s, so a bound of its own
    would be a guess at the machine's speed."""
    with bounded("the progress reached", CALL_BOUND):
        deadline = time.monotonic() + CALL_BOUND
        while worker.is_alive() and time.monotonic() < deadline:
            with suppress(LiftbridgeError):
                if progress() >= count:
                    return True
            time.sleep(0.02)
        return False


def run(schedule: Schedule, rig: DevRig | Any) -> Verdict:
    """Run ``schedule`` on ``rig`` (a :class:`DevRig`, or an external rig) and judge it."""
    started = time.monotonic()
    tag = f"c{schedule.seed}-{uuid.uuid4().hex[:6]}"
    stream = f"campaign-{tag}"
    records = _records(schedule, tag)
    outcome = Outcome(records)
    occ = schedule.path == "exactly-once-occ"
    if rig.external:
        try:
            rig.await_ready()
        except Unsettled as exc:
            return Verdict(schedule, "unsettled", [], time.monotonic() - started, "", f"seed {schedule.seed}: {exc}")
    try:
        with LiftbridgeClient(rig.addresses, timeout=5.0, max_retries=8) as admin:
            admin.create_stream(
                stream, stream, partitions=schedule.partitions, replication_factor=3, optimistic_concurrency_control=occ
            )
            if schedule.path in INTERVAL_OPERATOR_PATHS:
                _publish_around_interval(admin, stream, records, outcome)
            elif schedule.path in READING_PATHS:
                admin.publish_many(stream, records, path="grpc", ack_policy=AckPolicy.ALL)
    except LiftbridgeError as exc:  # before any fault: the cluster was not ready for this run
        why = f"seed {schedule.seed}: the stream could not be set up before the run ({type(exc).__name__}: {exc})"
        return Verdict(schedule, "unsettled", [], time.monotonic() - started, "", why)
    client = LiftbridgeClient(rig.addresses, nats_servers=rig.client_nats, timeout=5.0, max_retries=8)
    watcher = LiftbridgeClient(rig.addresses, timeout=1.0, max_retries=0)
    call = _operator_call(schedule, rig, stream, outcome) if schedule.path in OPERATOR_PATHS else None
    if schedule.path == INTERVAL_PATH:
        call, outcome.progress_cursor = interval_call(client, stream, schedule.partitions, outcome, TRIES)
    call = call or _call(schedule, client, stream, outcome, EXTERNAL_ACK_WAIT if rig.external else ACK_WAIT)

    def progress() -> int:
        if outcome.progress_of is not None:  # in records, as the moment's fraction counts them
            return outcome.progress_of() * schedule.records // max(outcome.inside, 1)
        if schedule.path in READING_PATHS:  # the committed position
            cursor = outcome.progress_cursor or POSITION_CURSORS[schedule.path]
            return sum(watcher.fetch_cursor(cursor, stream, p) + 1 for p in range(schedule.partitions))
        return sum(watcher.fetch_partition_metadata(stream, p).newest_offset + 1 for p in range(schedule.partitions))

    try:
        worker = _strike_and_call(schedule, rig, stream, call, outcome, progress)
        worker.join(CALL_BOUND)
        if worker.is_alive():
            why = f"the call did not end within {CALL_BOUND:g} s"
            return Verdict(schedule, "hung", [why], time.monotonic() - started, "")
        stored = read_back(rig.addresses, stream, schedule.partitions)
        _read_positions(schedule, client, stream, outcome)
    except Unsettled as exc:
        why = f"seed {schedule.seed}: {exc}"
        return Verdict(schedule, "unsettled", [], time.monotonic() - started, outcome.struck, why)
    finally:
        client.close()
        watcher.close()
    violations = check(schedule, outcome, stored)
    returned = (
        outcome.acks is not None or outcome.written is not None or outcome.left_after is not None or outcome.finished
    )
    result = "returned" if returned else "raised"
    if outcome.errors:
        result += f" after {len(outcome.errors)} failure(s): " + ", ".join(map(failure_summary, outcome.errors))
    return Verdict(schedule, result, violations, time.monotonic() - started, outcome.struck)


def _strike_and_call(
    schedule: Schedule,
    rig: Any,
    stream: str,
    call: Callable[[], None],
    outcome: Outcome,
    progress: Callable[[], int],
) -> threading.Thread:
    """Start the call and strike at the schedule's moment; the call's thread, still running."""
    if schedule.moment == "before":
        heal = _strike(rig, schedule, stream)
        worker = _start(call)
        time.sleep(schedule.down)
        heal()
        outcome.struck = "before the call"
    elif schedule.moment in ("during", "recovery"):
        worker = _start(call)
        if _reached(progress, int(schedule.fraction * schedule.records), worker) and worker.is_alive():
            outcome.struck = f"with {progress_or(progress)} stored"
        else:
            outcome.struck = "after the call ended (it was quicker than the moment)"
        heal = _strike(rig, schedule, stream)
        time.sleep(schedule.down)
        heal()
        if schedule.moment == "recovery":
            time.sleep(schedule.second_after)
            heal = _strike(rig, schedule, stream)
            time.sleep(schedule.down)
            heal()
    else:
        worker = _start(call)
        worker.join(CALL_BOUND)
        heal = _strike(rig, schedule, stream)
        time.sleep(schedule.down)
        heal()
        outcome.struck = "after the call returned"
    return worker


#: How long the positions a finished reading run left are asked for before the run is reported
#: as unsettled (a cursors partition without a leader answers NotLeaderError meanwhile).
POSITIONS_WITHIN = 90.0


def _read_positions(schedule: Schedule, client: LiftbridgeClient, stream: str, outcome: Outcome) -> None:
    """Where a finished reading run left its positions: what a next run would read again.

    :raises Unsettled: the positions could not be read in :data:`POSITIONS_WITHIN` s.
    """
    planned = schedule.path in ("consume", INTERVAL_PATH) and outcome.planned
    if not (planned or (schedule.path in ("consume-operator", "archive") and outcome.finished)):
        return
    with bounded("the positions read", POSITIONS_WITHIN):
        deadline = time.monotonic() + POSITIONS_WITHIN
        while True:
            try:
                if schedule.path == "consume":
                    outcome.left_after = _left_after(client, stream, schedule)
                elif schedule.path == INTERVAL_PATH:
                    outcome.left_after = ends_again(client, stream, schedule.partitions, outcome.planned)
                else:
                    outcome.planned = _ends(client, stream, schedule.partitions)
                    cursor = POSITION_CURSORS[schedule.path]
                    outcome.left_after = sum(
                        end - 1 - client.fetch_cursor(cursor, stream, p) for p, end in outcome.planned.items()
                    )
                return
            except LiftbridgeError as exc:
                if time.monotonic() > deadline:
                    raise Unsettled(
                        f"the positions could not be read in {POSITIONS_WITHIN:g} s ({type(exc).__name__}: {exc})"
                    ) from exc
                time.sleep(1.0)


def progress_or(progress: Callable[[], int]) -> str:
    try:
        return str(progress())
    except LiftbridgeError:
        return "?"


def _strike(rig: Any, schedule: Schedule, stream: str) -> Callable[[], None]:
    if schedule.target == "cluster" and schedule.action == "kill":
        # Every broker down for ``down`` seconds, then up through the restart window: one call,
        # run beside the path; healing waits for it.
        restart = _start(lambda: rig.restart_cluster(schedule.down))
        return lambda: restart.join(60 + schedule.down)
    partition = schedule.seed % schedule.partitions
    return rig.strike(schedule.target, schedule.action, stream, partition)


def _start(call: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def _call(
    schedule: Schedule, client: LiftbridgeClient, stream: str, outcome: Outcome, ack_wait: float
) -> Callable[[], None]:
    """The path's calls, on a thread: results and failures go into ``outcome``; each record waits
    ``ack_wait`` seconds for its ack."""
    records = outcome.records

    def publish() -> None:
        path = "nats" if schedule.path == "bulk-nats" else "grpc"
        try:
            outcome.acks = client.publish_many(stream, records, path=path, ack_policy=AckPolicy.ALL, timeout=ack_wait)
        except LiftbridgeError as exc:
            outcome.errors.append(exc)

    def exactly_once() -> None:
        options = PublishOptions(ack_policy=AckPolicy.ALL, path="nats", timeout=ack_wait)
        for _ in range(TRIES):
            try:
                with ExactlyOncePublisher(client, stream, f"campaign/{stream}", options=options) as eo:
                    result = eo.publish(records)
                outcome.written = result.written + result.skipped
                return
            except LiftbridgeError as exc:
                outcome.errors.append(exc)
                if isinstance(exc, ReplacedHistoryError):
                    return  # as the operators do: no retry over a replaced history (ADR 8, seed 59919)
                time.sleep(1.0)  # as a task retry would, a moment later

    def consume() -> None:
        for _ in range(TRIES):
            try:
                planner = RangePlanner(
                    client, stream, position_cursor="campaign", plan_key="campaign/consume", run_id="run-1"
                )
                plans = planner.plan(list(range(schedule.partitions)))
                outcome.planned = {p.partition: p.end for p in plans}

                def handle(batch: list[Any]) -> int:
                    outcome.consumed.extend((m.partition, m.offset, m.value) for m in batch)
                    return 0

                read_plan(client, plans, handle, position_cursor="campaign", batch_size=200)
                return
            except LiftbridgeError as exc:
                outcome.errors.append(exc)
                time.sleep(1.0)
        outcome.planned = {}  # never finished: nothing to hold it to

    return {"bulk-nats": publish, "grpc": publish, "consume": consume}.get(schedule.path, exactly_once)


OPERATOR_PATHS = ("consume-operator", "archive", *INTERVAL_OPERATOR_PATHS)
_DAG_IDS = {
    "consume-operator": "liftbridge_campaign_consume",
    "archive": "liftbridge_campaign_archive",
    "consume-operator-interval": "liftbridge_campaign_consume_interval",
    "archive-interval": "liftbridge_campaign_archive_interval",
}
_DAGS = Path(__file__).parent / "dags"
_AIRFLOW_READY: list[bool] = []


def _operator_call(schedule: Schedule, rig: Any, stream: str, outcome: Outcome) -> Callable[[], None]:
    """The operator paths: one ``dag.test()`` run of ``dags/reliability_campaign.py`` in a process
    of its own, the task retried by Airflow; the messages handed over (consume) or the archive's
    rows (archive) go into ``outcome``."""
    from tests.airflow_support import configure_airflow, init_db, liftbridge_conn_json

    from .scenarios import run_dag_subprocess

    if not _AIRFLOW_READY:  # a migrated metadata database for dag.test(), once per process
        configure_airflow()
        init_db()
        _AIRFLOW_READY.append(True)
    work = Path(tempfile.mkdtemp(prefix="campaign-"))
    archive, seen, out = work / "archive", work / "seen", work / "result.json"
    env = dict(os.environ) | {
        "AIRFLOW__CORE__DAGS_FOLDER": str(_DAGS),
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": liftbridge_conn_json(",".join(rig.addresses)),
        "EO_DAG_ID": _DAG_IDS[schedule.path],
        "EO_STREAM": stream,
        "EO_ARCHIVE": f"file://{archive}",
        "EO_SEEN": str(seen),
        "EO_OUT": str(out),
    }
    if schedule.path in INTERVAL_OPERATOR_PATHS:
        assert outcome.interval is not None
        start, end = (_moment(ns).isoformat() for ns in outcome.interval)
        env |= {"EO_INTERVAL_START": start, "EO_INTERVAL_END": end, "EO_INTERVAL_LAYOUT": INTERVAL_LAYOUT}
        if schedule.path == "archive-interval":
            outcome.progress_of = lambda: _rows_in(archive)
        else:
            outcome.progress_of = lambda: _lines_in(seen) // 2

    def call() -> None:
        done = run_dag_subprocess(env, timeout=400)
        state = json.loads(out.read_text())["state"] if out.exists() else f"not finished (exit {done.returncode})"
        if state != "success":
            outcome.errors.append(RuntimeError(f"the DAG run ended {state}: {done.stderr[-800:]}"))
            return
        outcome.finished = True
        if schedule.path == "archive":
            outcome.archived = _archived(archive)
        elif schedule.path == "archive-interval":
            outcome.archived, outcome.folders = _archived_in_folders(archive)
        else:
            lines = seen.read_text().split() if seen.exists() else []
            outcome.consumed = [(int(p), int(o), None) for p, o in zip(lines[::2], lines[1::2], strict=True)]  # type: ignore[misc]

    return call


def _ends(client: LiftbridgeClient, stream: str, partitions: int) -> dict[int, int]:
    """Each partition's end (high watermark + 1): the reading paths read a stream filled before."""
    return {p: client.fetch_partition_metadata(stream, p).high_watermark + 1 for p in range(partitions)}


def _archived(directory: Path) -> Counter[tuple[int, int]]:
    import pyarrow.parquet as pq

    rows: Counter[tuple[int, int]] = Counter()
    for path in directory.glob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset"]).to_pydict()
        rows.update(zip(table["partition"], table["offset"], strict=True))
    return rows


def _archived_in_folders(directory: Path) -> tuple[Counter[tuple[int, int]], dict[tuple[int, int], set[str]]]:
    """The rows of every finished file under ``directory`` (temporary files are not ``*.parquet``),
    and the folders (relative to ``directory``) each row was found in."""
    import pyarrow.parquet as pq

    rows: Counter[tuple[int, int]] = Counter()
    folders: dict[tuple[int, int], set[str]] = {}
    for path in directory.rglob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset"], partitioning=None).to_pydict()
        folder = str(path.parent.relative_to(directory))
        for key in zip(table["partition"], table["offset"], strict=True):
            rows[key] += 1
            folders.setdefault(key, set()).add(folder)
    return rows, folders


def _rows_in(directory: Path) -> int:
    import pyarrow.parquet as pq

    total = 0
    for path in directory.rglob("*.parquet"):
        with suppress(OSError, ValueError):  # a file renamed in, or gone, while looked at
            total += pq.read_metadata(path).num_rows
    return total


def _lines_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


#: Seconds between the rounds of the interval operator paths' publish and the interval's bounds.
ROUND_GAP = 0.05
#: The second third is published in this many slices, this many seconds apart.
MIDDLE_SLICES, MIDDLE_GAP = 4, 0.4


def _moment(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, dt.UTC).replace(microsecond=(ns // 1000) % 1_000_000)


def _publish_around_interval(admin: LiftbridgeClient, stream: str, records: list[Record], outcome: Outcome) -> None:
    """Publish the first third of ``records``, take the interval's start, publish the second
    third (in slices, over more than a second), take its end, publish the rest: with real
    reception timestamps (the brokers stamp each message when they take it in, and the publish
    returns once every message is acked), the interval holds the second third. The bounds are
    whole microseconds (what the operator is given); the checker holds the run to the stored
    timestamps, not to this expectation."""
    third = len(records) // 3

    def mark() -> int:
        time.sleep(ROUND_GAP)
        ns = time.time_ns() // 1000 * 1000
        time.sleep(ROUND_GAP)
        return ns

    admin.publish_many(stream, records[:third], path="grpc", ack_policy=AckPolicy.ALL)
    start = mark()
    for i in range(MIDDLE_SLICES):  # spread over more than a second: more than one folder of the layout
        if i:
            time.sleep(MIDDLE_GAP)
        piece = records[third + i * third // MIDDLE_SLICES : third + (i + 1) * third // MIDDLE_SLICES]
        admin.publish_many(stream, piece, path="grpc", ack_policy=AckPolicy.ALL)
    end = mark()
    admin.publish_many(stream, records[2 * third :], path="grpc", ack_policy=AckPolicy.ALL)
    outcome.interval, outcome.inside = (start, end), third


def _interval_violations(schedule: Schedule, outcome: Outcome, stored: Sequence[Any]) -> list[str]:
    """The interval operator paths' invariants (module docstring), against the stored timestamps."""
    bad: list[str] = []
    assert outcome.interval is not None
    start, end = outcome.interval
    inside = {(m.partition, m.offset): m for m in stored if start <= m.timestamp < end}
    thirds = len(outcome.records) // 3
    middle = {r.value for r in outcome.records[thirds : 2 * thirds]}
    if {m.value for m in inside.values()} != middle:
        bad.append(
            f"the interval holds {len(inside)} stored message(s), not the {len(middle)} records published inside it "
            "(the reception timestamps do not follow the publish rounds)"
        )
    if schedule.path == "archive-interval":
        if outcome.archived is None:
            return bad
        missing = sorted(k for k in inside if not outcome.archived[k])
        twice = sorted(k for k, c in outcome.archived.items() if c > 1)
        outside = sorted(k for k in outcome.archived if k not in inside)
        # The folder INTERVAL_LAYOUT names, worked out here rather than by the layout's own code.
        misplaced = sorted(
            k
            for k, m in inside.items()
            if k in outcome.folders and outcome.folders[k] != {"sec=" + _moment(m.timestamp).strftime("%H%M%S")}
        )
        if missing:
            bad.append(f"{len(missing)} message(s) of the interval missing from the archive, e.g. {missing[:3]}")
        if twice:
            bad.append(f"{len(twice)} message(s) in the archive more than once, e.g. {twice[:3]}")
        if outside:
            bad.append(f"{len(outside)} message(s) outside the interval in the archive, e.g. {outside[:3]}")
        if misplaced:
            bad.append(f"{len(misplaced)} message(s) in another folder than the layout names, e.g. {misplaced[:3]}")
        return bad
    if not outcome.finished:
        return bad
    handed = {(p, o) for p, o, _ in outcome.consumed}
    skipped = sorted(k for k in inside if k not in handed)
    outside = sorted(k for k in handed if k not in inside)
    if skipped:
        bad.append(f"{len(skipped)} message(s) of the interval never handed to the function, e.g. {skipped[:3]}")
    if outside:
        bad.append(f"{len(outside)} message(s) outside the interval handed to the function, e.g. {outside[:3]}")
    return bad


def _left_after(client: LiftbridgeClient, stream: str, schedule: Schedule) -> int:
    """Offsets a next run would read (nothing was published after the finished run: none)."""
    planner = RangePlanner(client, stream, position_cursor="campaign", plan_key="campaign/consume", run_id="run-2")
    return sum(p.remaining for p in planner.plan(list(range(schedule.partitions))))


def run_seeds(seeds: Sequence[int], **draw_kwargs: Any) -> Iterator[Verdict]:
    """Run the schedule of each seed on a fresh dev rig."""
    for seed in seeds:
        schedule = draw(seed, **draw_kwargs)
        with DevRig() as rig:
            yield run(schedule, rig)
