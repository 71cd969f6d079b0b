"""What keeps a consumer-group member alive while its caller is away, and when it gives up.

A member heartbeats by fetching its assignments (:func:`.consumer.fetch_assignments`). While the
caller is in a call (a poll, a check, a commit) the call does it, when due. While the caller is
away, handling a message or a batch, the member's *keeper* does: a thread of the blocking
:class:`~.group_consumer.GroupConsumer`, a task of the asyncio one, both running :func:`tend`,
so a batch slower than the group's consumer timeout does not cost the member its partitions. This
is Kafka's background heartbeat (KIP-62) and go-liftbridge's ``consumerLoop`` goroutine, which
fetches the assignments apart from message handling.

The keeper only fetches: what it learns waits in :attr:`~.consumer.GroupMember.pending` until the
caller's next call adopts it (:func:`.consumer.adopt`), so a revoked partition is committed only
once the caller asked for more, i.e. once what it was given is done, and a poll that the caller
left in the middle ends at the next message instead of reading a partition the group moved.

A caller that never comes back is bounded apart (Kafka's ``max.poll.interval.ms``): once it has
been away for ``max_poll_interval`` seconds (default :data:`.consumer.MAX_POLL_INTERVAL`, 5
minutes), the keeper leaves the group without committing (what is in the caller's hands is not
done) and stops; the other members take its partitions over from the group's positions. When the
caller comes back (:func:`caller_back`, the first step of each of its calls), a member whose caller
was away that long has left, whether or not its keeper got to run meanwhile (a blocked event loop,
a starved process): the step leaves then. Its next poll forgets the old partitions and joins
again; ``commit()`` and :func:`still_owner` (for a caller that commits positions itself, as the
consume operator does after each batch) raise :class:`~.consumer.MaxPollIntervalExceededError`
instead of storing positions that are no longer its own.

The front ends run one call at a time per member (a caller's or the keeper's), so the member's
state has one writer at a time.
"""

from __future__ import annotations

import time

from .consumer import GroupMember, fetch_assignments, require_membership, retry_wait, send_leave
from .effects import Op
from .routing import ClientCore

__all__ = ["caller_back", "owner_gone", "retry_after_failure", "still_owner", "tend", "wait_for_caller"]

#: Seconds between two looks of a keeper whose caller is in a call (the call heartbeats then).
LOOK_AGAIN = 0.1


def owner_gone(member: GroupMember, now: float) -> bool:
    """Whether the caller has been away for ``max_poll_interval`` seconds or more."""
    return (
        member.max_poll_interval is not None
        and member.away_since is not None
        and now - member.away_since >= member.max_poll_interval
    )


def _next_step(member: GroupMember, now: float) -> float:
    due = member.next_heartbeat
    if member.max_poll_interval is not None and member.away_since is not None:
        due = min(due, member.away_since + member.max_poll_interval)
    return max(due - now, 0.0)


def caller_back(core: ClientCore, member: GroupMember) -> Op[None]:
    """The first step of each of the caller's calls: it is back (in a call now). If it was away
    for ``max_poll_interval`` or more and the keeper has not left for it yet (the keeper did not
    run meanwhile), leave now, without a commit, as the keeper would have: what happens to a late
    caller depends on how long it was away, never on whether its keeper got to run.

    :raises UnavailableError: / :raises ConsumerGroupError: the leave failed (see
        :func:`.consumer.send_leave`); the member counts as left all the same.
    """
    gone = member.joined and not member.left_idle and owner_gone(member, time.monotonic())
    member.away_since = None
    if gone:
        member.left_idle = True  # before the call: a failed leave still refuses the late commit
        yield from send_leave(core, member)


def still_owner(member: GroupMember) -> Op[None]:
    """For a caller about to commit positions of its own (after :func:`caller_back`): refuse if
    the member left the group for ``max_poll_interval`` since the caller's last call.

    :raises MaxPollIntervalExceededError: it left; its partitions are other members' now.
    """
    require_membership(member)
    yield from ()


def tend(core: ClientCore, member: GroupMember) -> Op[float | None]:
    """One step of the keeper, run while the caller is away: leave the group if the caller has
    been away too long, else fetch the assignments when due. Returns the seconds until the next
    step, or ``None`` when there is nothing left to keep (the member is not in the group).

    :raises ConsumerGroupError: / :raises UnavailableError: see :func:`.consumer.heartbeat`
        (the keeper logs it and tries again; the caller's next call meets it itself).
    """
    if not member.joined or member.left_idle:
        return None
    if owner_gone(member, time.monotonic()):
        yield from send_leave(core, member)
        member.left_idle = True
        return None
    if time.monotonic() >= member.next_heartbeat:
        yield from fetch_assignments(core, member)
    return _next_step(member, time.monotonic())


def wait_for_caller(member: GroupMember) -> float:
    """Seconds a keeper waits before looking again while the caller is in a call (which heartbeats
    itself): until the next heartbeat is due, then a little at a time."""
    return max(member.next_heartbeat - time.monotonic(), LOOK_AGAIN)


def retry_after_failure(member: GroupMember) -> float:
    """Seconds a keeper waits after a step failed (a refusal, no broker): the heartbeat's retry wait."""
    return retry_wait(member)
