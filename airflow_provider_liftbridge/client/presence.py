"""Telling a stream that does not exist from one a broker does not know yet.

Two moments when a real Liftbridge cluster says "no such stream" about a stream that exists
(``liftbridge-semantics.md``):

- **Right after a full-cluster restart** it answers, for a short while, as if it had no streams:
  FetchMetadata lists the brokers and no streams (about 0.3 s), then streams whose partitions have
  no leader, while Publish answers "no such stream" for 1-2 s.
- **Right after CreateStream** the new stream reaches the brokers one by one: the broker that
  created it knows it at once, another may answer "no such stream" (and FetchMetadata
  UNKNOWN_STREAM) for a moment (seen in 1 of 14 create-then-publish runs). Its metadata then
  says nothing either: the broker asked may not list the stream yet.

The rule the client follows (subscriptions, publishes, exactly-once publishing):

- A "no such stream / partition" answer about a stream the caller has **never seen** (never
  listed in metadata this client fetched, never created by it) is believed at once: that is a
  wrong name or a stream not created yet, and waiting would only delay the error.
- About a stream the caller has **just** created, or been told exists ("already exists"), within
  :data:`FRESH_FOR` seconds (:meth:`StreamSightings.fresh`), it is not believed at all: the caller waits its usual
  backoff and tries again (a lookup of its metadata asks again too), within its own budget, and
  raises the last error when the budget runs out.
- About a stream the caller **has seen** before that, it is only a suspicion. The caller waits its usual
  backoff, fetches the metadata of all streams, and believes it when :func:`missing_confirmed`
  says so: the cluster has elected leaders again (some partition has one) and still does not list
  the stream. Otherwise it retries, within its own budget (the call's timeout, and at least
  ``max_retries`` retries, for a call; ``resubscribe_wait`` for a subscription; ``max_resumes``
  for exactly-once publishing), and
  raises the last error when the budget runs out.

Over NATS nobody says "no such stream": what is published to a partition without a leader is
dropped and its ack times out. ``publish_many`` then sends again only the records its partition
certainly does not hold (the leader's newest offset is what it held before the batch plus the
records it acknowledged), within the ack timeout and at least ``max_retries`` rounds
(``publishing/timeout_recovery.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .types import Metadata

__all__ = ["FRESH_FOR", "StreamSightings", "cluster_ready", "missing_confirmed"]

#: Seconds after this client created a stream, or was told it exists, during which "no such
#: stream" about it is taken for the stream still reaching the broker that answered. Propagation
#: takes a moment; this leaves room for a loaded cluster.
FRESH_FOR = 10.0


class StreamSightings:
    """The streams a client has seen (listed in a metadata answer, created by it, or reported
    existing by the server). ``name in sightings`` asks whether it ever saw ``name``;
    :meth:`fresh` whether it created it, or was told it exists, within :data:`FRESH_FOR` seconds."""

    __slots__ = ("_born", "_seen")

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._born: dict[str, float] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._seen

    def update(self, names: Iterable[str]) -> None:
        """``names`` were listed in metadata."""
        self._seen.update(names)

    def created(self, name: str) -> None:
        """This client created ``name``, or was told it exists, just now."""
        self._seen.add(name)
        self._born[name] = time.monotonic()

    def forget(self, name: str) -> None:
        """This client deleted ``name``: a "no such stream" about it is believed again."""
        self._seen.discard(name)
        self._born.pop(name, None)

    def fresh(self, name: str) -> bool:
        """Whether this client created ``name``, or was told it exists, within :data:`FRESH_FOR` seconds."""
        born = self._born.get(name)
        return born is not None and time.monotonic() - born <= FRESH_FOR


def cluster_ready(metadata: Metadata) -> bool:
    """Whether ``metadata`` (an answer for all streams) shows a cluster past its restart window:
    at least one partition of some stream has a leader."""
    return any(part.leader for info in metadata.streams.values() for part in info.partitions.values())


def missing_confirmed(metadata: Metadata, stream: str, partition: int | None = None) -> bool:
    """Whether ``metadata`` (an answer for all streams) confirms that ``stream`` (or its
    ``partition``) does not exist: the cluster is ready (see :func:`cluster_ready`) and does not
    list it. ``False`` while the cluster is still loading, and when it lists the stream."""
    if not cluster_ready(metadata):
        return False
    info = metadata.streams.get(stream)
    return info is None or (partition is not None and partition not in info.partitions)
