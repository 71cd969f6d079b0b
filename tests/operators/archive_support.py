"""Functions the archiver tests hand to LiftbridgeStreamToFileOperator's ``on_file`` by dotted
path (the DAG runs in the test's process, so the test reads what they recorded)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import get_current_context

#: (try number, file entry) of every file the archiver reported.
FILES: list[tuple[int, dict[str, Any]]] = []


def reset() -> None:
    FILES.clear()


def fail_first_try_at_file(entry: dict[str, Any], fail_at: int) -> None:
    """Record the file; on the first try, raise once ``fail_at`` files (1-based) are complete:
    that file exists under its final name, its position is not committed."""
    tries = get_current_context()["ti"].try_number
    FILES.append((tries, entry))
    if tries == 1 and sum(1 for t, _ in FILES if t == 1) == fail_at:
        raise RuntimeError(f"injected failure after file {entry['path']}")
