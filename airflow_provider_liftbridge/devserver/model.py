"""The dev server's shared types: brokers, stream settings, cluster time-outs, subjects and the
shape of a new message. The state, the partitions, replication and the cluster all import them,
and they import nothing of those.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from airflow_provider_liftbridge._proto import api_pb2

_SUBJECT_BAD_CHARS = re.compile(r"[\s]")


def is_valid_subject(subject: str) -> bool:
    """A NATS subject: no whitespace, no empty token (the real server's check)."""
    return bool(subject) and not _SUBJECT_BAD_CHARS.search(subject) and all(subject.split("."))


def partition_subject(subject: str, partition: int) -> str:
    """Subject of a partition: the stream subject for partition 0, ``subject.N`` otherwise."""
    return subject if partition == 0 else f"{subject}.{partition}"


#: How often a stream's cleaner runs when its ``cleanerInterval`` is unset: Liftbridge's default
#: (``streams.cleaner.interval``, 5 minutes), so a stream expires nothing sooner than it would there.
DEFAULT_CLEANER_INTERVAL_MS = 5 * 60 * 1000


@dataclass
class StreamConfig:
    """Per-stream settings from ``CreateStreamRequest`` (durations in milliseconds, as the Go client sends them)."""

    retention_max_bytes: int = 0
    retention_max_messages: int = 0
    retention_max_age_ms: int = 0
    cleaner_interval_ms: int = 0
    segment_max_bytes: int = 0
    segment_max_age_ms: int = 0
    compact_enabled: bool = False
    compact_max_goroutines: int = 0
    auto_pause_time_ms: int = 0
    auto_pause_disable_if_subscribers: bool = False
    min_isr: int = 0
    optimistic_concurrency_control: bool = False

    @classmethod
    def from_request(cls, req: api_pb2.CreateStreamRequest) -> StreamConfig:
        """Read the nullable fields of a create request (unset ones keep their defaults)."""
        cfg = cls()
        mapping = {
            "retentionMaxBytes": "retention_max_bytes",
            "retentionMaxMessages": "retention_max_messages",
            "retentionMaxAge": "retention_max_age_ms",
            "cleanerInterval": "cleaner_interval_ms",
            "segmentMaxBytes": "segment_max_bytes",
            "segmentMaxAge": "segment_max_age_ms",
            "compactEnabled": "compact_enabled",
            "compactMaxGoroutines": "compact_max_goroutines",
            "autoPauseTime": "auto_pause_time_ms",
            "autoPauseDisableIfSubscribers": "auto_pause_disable_if_subscribers",
            "minIsr": "min_isr",
            "optimisticConcurrencyControl": "optimistic_concurrency_control",
        }
        for proto_name, attr in mapping.items():
            if req.HasField(proto_name):
                setattr(cfg, attr, getattr(req, proto_name).value)
        return cfg


def broker_id(index: int) -> str:
    """The id broker ``index`` of a dev server reports in FetchMetadata."""
    return f"broker-{index}"


# -- a broker cut off (isolation.py) -------------------------------------------------------
#: How a broker is cut off (:attr:`~.model.BrokerSlot.isolated`): from NATS, or from its peers.
ISOLATIONS = ("nats", "peers")
#: What a cut does to the broker's NATS traffic (isolation.py's docstring).
KINDS = ("cut", "cut-in", "cut-out", "slow", "lossy")
#: The kinds whose broker its peers lose (:attr:`~.model.BrokerSlot.isolated` is set for them).
LOST_TO_PEERS = ("cut", "cut-in", "cut-out")
#: Seconds each NATS message of a ``"slow"`` broker waits, each way (a replication round: twice),
#: at most: the cluster makes it an eighth of the lag time if that is less, so that a follower
#: that checks in idle still reaches its leader well within the lag time and its peers keep it.
SLOW_DELAY = 0.5
#: The share of a ``"lossy"`` broker's NATS messages lost each way, however few it sends.
LOSSY_SHARE = 0.05
#: Messages a second a ``"lossy"`` link carries each way, and how many wait beyond that: past
#: them a burst is lost (as on a link whose queue overflows; messages counted, not bytes).
LOSSY_RATE = 1000.0
LOSSY_BURST = 64
Direction = Literal["in", "out"]


class BrokerLink:
    """A cut broker's NATS link: its scope (``"nats"`` or ``"peers"``) and kind (:data:`KINDS`).

    :param delay: seconds each message of a ``"slow"`` link waits, each way.
    :param seed: the seed of a lossy link's losses (``None``: from the system).
    :raises ValueError: a scope or kind that is not one of :data:`ISOLATIONS` / :data:`KINDS`.
    """

    def __init__(self, scope: str, kind: str, *, delay: float = SLOW_DELAY, seed: int | None = None) -> None:
        if scope not in ISOLATIONS:
            raise ValueError(f"cannot cut a broker off by {scope!r}; choose one of {', '.join(ISOLATIONS)}")
        if kind not in KINDS:
            raise ValueError(f"unknown kind of cut {kind!r}; choose one of {', '.join(KINDS)}")
        self.scope, self.kind = scope, kind
        self.delay = delay if kind == "slow" else 0.0
        self._rng = random.Random(seed)
        now = time.monotonic()
        self._tokens: dict[str, tuple[float, float]] = {"in": (LOSSY_BURST, now), "out": (LOSSY_BURST, now)}

    def __repr__(self) -> str:
        return f"BrokerLink({self.scope!r}, {self.kind!r})"

    @property
    def frozen(self) -> bool:
        """Whether the broker learns nothing of the metadata (it answers from what it knew)."""
        return self.kind in ("cut", "cut-in")

    def passes(self, direction: Direction, count: int = 1) -> list[bool]:
        """Which of ``count`` messages sent now in ``direction`` (``"in"``: to the broker) arrive."""
        if self.kind in ("cut", f"cut-{direction}"):
            return [False] * count
        if self.kind != "lossy":
            return [True] * count
        tokens, at = self._tokens[direction]
        now = time.monotonic()
        tokens = min(float(LOSSY_BURST), tokens + (now - at) * LOSSY_RATE)
        out = []
        for _ in range(count):
            fits = tokens >= 1.0
            tokens -= fits
            out.append(fits and self._rng.random() >= LOSSY_SHARE)
        self._tokens[direction] = (tokens, now)
        return out

    def one(self, direction: Direction) -> bool:
        """Whether one message sent now in ``direction`` arrives."""
        return self.passes(direction)[0]


@dataclass
class BrokerSlot:
    """One broker of the (single-process) cluster."""

    index: int
    id: str
    host: str
    port: int
    live: bool = False
    #: Frozen like a SIGSTOPped process: no replication, calls to it wait (cluster fault hook).
    stalled: bool = False
    #: Cut off (cluster fault hook, isolation.py): ``"nats"`` from NATS and so from its peers,
    #: ``"peers"`` from its peers only; its clients still reach it. ``""`` while its peers reach it
    #: (also while its link is only slow or lossy).
    isolated: str = ""
    #: Its cut, of any kind (isolation.py): what happens to its NATS messages; ``None`` while none.
    link: BrokerLink | None = None
    #: What an isolated broker last knew of each partition: (stream, partition) -> (leader, ISR).
    known: dict[tuple[str, int], tuple[str, list[str]]] = field(default_factory=dict)


CommitCallback = Callable[[Any, int], None]
#: One message for :meth:`Partition.append_many`: key, value, headers, subject, reply, expected offset.
NewMessage = tuple[bytes, bytes, Mapping[str, bytes] | None, str, str, int]
#: The offset :meth:`Partition.append_many` gives a message refused by optimistic concurrency control.
REFUSED = -1

#: A phase of the restart window a test hook can hold the cluster in (``restart_cluster(hold=...)``).
RestartHold = Literal["no-leaders", "no-commits"]


@dataclass(frozen=True)
class ClusterTimings:
    """The time-outs of cluster mode, in seconds, and the server's minimum ISR.

    The defaults are Liftbridge's (``replica.max.lag.time`` and ``replica.max.leader.timeout``
    15 s) and the restart window observed on a real three-broker cluster (metadata without streams
    for about 0.3 s, Publish refused with "no such stream" for 1-2 s, high watermark -1 for about
    9 s). :meth:`fast` scales them down for tests.

    :param replica_max_lag_time: a follower that has not fetched, or not caught up, for this long
        leaves the ISR.
    :param replica_max_leader_timeout: a dead or stalled leader is replaced after this long.
    :param min_insync_replicas: the server's ``min.insync.replicas`` (a stream's ``minIsr`` wins).
    :param restart_no_streams: after a full-cluster restart, FetchMetadata lists no streams and
        FetchPartitionMetadata and Subscribe answer NOT_FOUND for this long.
    :param restart_no_leaders: until this long after the restart, partitions have no leader and
        Publish/PublishAsync answer NOT_FOUND "no such stream".
    :param restart_hw_unknown: until this long after the restart, high watermarks read -1 and
        nothing commits (ALL acks and subscribers wait).
    :param metadata_election_timeout: a stalled or dead metadata (Raft) leader is replaced after
        this long; until then metadata changes wait (about Raft's heartbeat plus election time).
    :param metadata_cache_max_age: FetchMetadata surveys the other brokers (and waits for a stalled
        one) unless its broker list is younger than this (Liftbridge's ``metadata.cache.max.age``).
    :param replica_max_idle_wait: when the NATS connection is lost, followers fetch again only
        this long after (Liftbridge's ``replica.max.idle.wait``: a follower that loses its NATS
        server sleeps it out), so commits and ALL acks stall that long.
    :param stream_propagation: a new stream is known at once by the metadata leader and its
        partition leaders, by the other brokers (the one that forwarded CreateStream included) this
        long after (later if the metadata leader stops running before then); they answer "no such
        stream" until then. The default is hashicorp/raft's ``CommitTimeout`` (50 ms), which
        Liftbridge keeps: how long a follower may wait to learn that an entry was committed.
        ``replica_max_idle_wait`` is also how long after a killed leader is back (still leader) its
        followers fetch from it again (their fetches failed while it was gone).
    :param hw_checkpoint_interval: every broker writes the high watermarks of its replicas to disk
        this often (and on a clean stop); a killed broker's replicas come back with them
        (Liftbridge's commit log, ``HWCheckpointInterval``, 5 s).
    :raises ValueError: a negative duration, a restart window out of order, or a minimum ISR below 1.
    """

    replica_max_lag_time: float = 15.0
    replica_max_leader_timeout: float = 15.0
    min_insync_replicas: int = 1
    restart_no_streams: float = 0.3
    restart_no_leaders: float = 1.5
    restart_hw_unknown: float = 9.0
    metadata_election_timeout: float = 2.0
    metadata_cache_max_age: float = 120.0
    stream_propagation: float = 0.05
    replica_max_idle_wait: float = 10.0
    hw_checkpoint_interval: float = 5.0

    def __post_init__(self) -> None:
        durations = (
            self.replica_max_idle_wait,
            self.hw_checkpoint_interval,
            self.metadata_election_timeout,
            self.metadata_cache_max_age,
            self.stream_propagation,
            self.replica_max_lag_time,
            self.replica_max_leader_timeout,
            self.restart_no_streams,
            self.restart_no_leaders,
            self.restart_hw_unknown,
        )
        if min(durations) < 0:
            raise ValueError(f"cluster timings cannot be negative: {self}")
        if not self.restart_no_streams <= self.restart_no_leaders <= self.restart_hw_unknown:
            raise ValueError(
                "the restart window's phases end in order: restart_no_streams <= restart_no_leaders "
                f"<= restart_hw_unknown, got {self.restart_no_streams}, {self.restart_no_leaders}, "
                f"{self.restart_hw_unknown}"
            )
        if self.min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be at least 1, got {self.min_insync_replicas}")

    @classmethod
    def fast(cls, **overrides: Any) -> ClusterTimings:
        """Timings for tests: lag time and leader timeout 0.5 s, the restart window a tenth of the
        real one (0.03 s, 0.15 s, 0.9 s), metadata election 0.2 s, idle wait after a NATS loss or a
        leader's restart 1 s, high watermark checkpoints every 0.5 s. Keywords override single values."""
        base = cls(
            replica_max_lag_time=0.5,
            replica_max_leader_timeout=0.5,
            metadata_election_timeout=0.2,
            replica_max_idle_wait=1.0,
            hw_checkpoint_interval=0.5,
            restart_no_streams=0.03,
            restart_no_leaders=0.15,
            restart_hw_unknown=0.9,
        )
        return replace(base, **overrides)

    def restart_window(self) -> str:
        """The three restart phases as the command line takes them (``0.3,1.5,9``)."""
        return f"{self.restart_no_streams:g},{self.restart_no_leaders:g},{self.restart_hw_unknown:g}"
