"""Telling a stream that does not exist from one a restarting cluster has not loaded yet.

Right after a full-cluster restart a real Liftbridge cluster answers, for a short while, as if it
had no streams (``liftbridge-semantics.md``): FetchMetadata lists the brokers and no streams
(about 0.3 s), then streams whose partitions have no leader, while Publish answers "no such
stream" for 1-2 s. A NOT_FOUND in that window says nothing about the stream.

The rule the client follows (subscriptions, publishes, exactly-once publishing):

- A "no such stream / partition" answer about a stream the caller has **never seen** (never
  listed in metadata this client fetched, never subscribed to successfully) is believed at once:
  that is a wrong name or a stream not created yet, and waiting would only delay the error.
- About a stream the caller **has seen**, it is only a suspicion. The caller waits its usual
  backoff, fetches the metadata of all streams, and believes it when :func:`missing_confirmed`
  says so: the cluster has elected leaders again (some partition has one) and still does not list
  the stream. Otherwise it retries, within its own budget (``max_retries`` for a call,
  ``resubscribe_wait`` for a subscription, ``max_resumes`` for exactly-once publishing), and
  raises the last error when the budget runs out.

Over NATS nobody says "no such stream": what is published to a partition without a leader is
dropped and its ack times out. ``publish_many`` then sends again only the records its partition
certainly does not hold (the leader's newest offset is what it held before the batch plus the
records it acknowledged), within ``max_retries`` (``publishing/batch.py``).
"""

from __future__ import annotations

from .types import Metadata

__all__ = ["cluster_ready", "missing_confirmed"]


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
