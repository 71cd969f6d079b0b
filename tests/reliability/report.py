"""Print the reliability table: ``python -m tests.reliability.report`` (about 1-2 minutes).

Runs every fault scenario of :mod:`tests.reliability.scenarios` once and prints, per scenario, the
faults injected, records sent, records of the scenario found in the stream, lost and duplicated.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tests.airflow_support import configure_airflow, init_db


def _rows() -> list[tuple[str, Callable[[], object]]]:
    from airflow_provider_liftbridge.devserver import DevServer

    from . import exactly_once_frozen, scenarios

    server = DevServer().start()

    def task_kill(fault: str) -> Callable[[], object]:
        return lambda: scenarios.task_kill(server.address, fault)

    def _restart(kind: str) -> Callable[[], object]:
        return lambda: scenarios.full_restart(kind)

    def _frozen(role: str, occ: bool) -> Callable[[], object]:
        return lambda: exactly_once_frozen.frozen_broker(role, occ)

    return [
        ("server_kill_eo", lambda: scenarios.server_kill(exactly_once=True)),
        ("server_kill_alo", lambda: scenarios.server_kill(exactly_once=False)),
        ("server_stall", scenarios.server_stall),
        ("task_kill_exit", task_kill("exit")),
        ("task_kill_raise", task_kill("raise")),
        ("cluster_failover", scenarios.cluster_failover),
        ("nats_restart", scenarios.nats_restart),
        ("cluster_stalled_follower", lambda: scenarios.stalled_follower(occ=False)),
        ("cluster_stalled_follower_occ", lambda: scenarios.stalled_follower(occ=True)),
        ("cluster_leader_killed_tail", scenarios.leader_killed_with_tail),
        *((f"cluster_restart_{kind.replace(' ', '_')}", _restart(kind)) for kind in scenarios.WAITERS),
        *(
            (f"cluster_frozen_{role.replace(' ', '_')}{'_occ' if occ else ''}", _frozen(role, occ))
            for role in exactly_once_frozen.ROLES
            for occ in (False, True)
        ),
        ("overlapping_tries", exactly_once_frozen.overlapping_tries),
    ]


def main() -> int:
    configure_airflow()
    init_db()
    header = ("scenario", "faults injected", "sent", "in stream", "lost", "duplicated", "s", "notes")
    lines = []
    for name, run in _rows():
        started = time.monotonic()
        try:
            f = run()
            lines.append(
                (f.scenario, f.faults, f.sent, f.in_stream, f.lost, f.duplicated, f"{f.seconds:.1f}", f.notes[:100])  # type: ignore[attr-defined]
            )
            print(f"{name}: {f}", file=sys.stderr)
        except Exception as exc:  # a failed scenario is a row too
            lines.append(
                (
                    name,
                    f"FAILED: {type(exc).__name__}: {exc}"[:120],
                    "",
                    "",
                    "",
                    "",
                    f"{time.monotonic() - started:.1f}",
                    "",
                )
            )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in lines:
        print("| " + " | ".join(str(c) for c in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
