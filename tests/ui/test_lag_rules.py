"""The lag verdict's rules (ui/lag.py), each on a window of commits that shows it, and the
thresholds' parsing. Pure functions: no cluster."""

from __future__ import annotations

import pytest

from airflow_provider_liftbridge.ui.lag import WINDOW, Commit, Thresholds, parse_thresholds, partition_status, worst

NOW = 10_000.0


def window(*rows: tuple[float, int, int]) -> list[Commit]:
    return [Commit(t, offset, lag) for t, offset, lag in rows]


def status(commits: list[Commit], lag: int, **kwargs: object) -> tuple[str, str]:
    verdict = partition_status(commits, lag, NOW, **kwargs)  # type: ignore[arg-type]
    return verdict["status"], verdict["rule"]


def test_no_lag_now_is_ok_whatever_the_window() -> None:
    assert status(window((9000, 5, 3), (9500, 5, 4)), 0) == ("OK", "no-lag")


def test_caught_up_once_in_the_window_is_ok() -> None:
    """Burrow's rule 1: lag 0 at any commit of the window makes the period OK, even if stalled."""
    assert status(window((9000, 5, 0), (9500, 5, 4), (9900, 5, 9)), 9) == ("OK", "caught-up")


def test_a_window_of_one_commit_is_not_judged() -> None:
    verdict = partition_status(window((9990, 5, 4)), 4, NOW)
    assert (verdict["status"], verdict["rule"], verdict["window"]) == ("OK", "window", 1)
    assert verdict["complete"] == pytest.approx(1 / WINDOW)


def test_a_position_moving_back_is_err() -> None:
    """Burrow's rule 2 (REWIND): an offset lower than the one before."""
    assert status(window((9000, 50, 4), (9500, 20, 40), (9900, 30, 30)), 30) == ("ERR", "rewind")


def test_no_commit_for_longer_than_the_window_spans_is_stop() -> None:
    """Burrow's rule 3: now - last commit > last - first commit."""
    commits = window((1000, 5, 4), (2000, 8, 5), (3000, 12, 6))
    assert status(commits, 9) == ("STOP", "stopped")  # 7000 s since the last, the window spans 2000 s
    assert status(window((8000, 5, 4), (9000, 8, 5), (9500, 12, 6)), 9)[0] != "STOP"  # 500 s < 1500 s


def test_the_stop_rule_can_be_left_out() -> None:
    commits = window((1000, 5, 4), (2000, 8, 5), (3000, 12, 6))
    assert status(commits, 9, stop_rule=False) == ("WARN", "lag-growing")


def test_the_same_position_throughout_with_lag_is_stall() -> None:
    """Burrow's rule 4: commits that do not move while there is lag."""
    assert status(window((9000, 7, 3), (9400, 7, 5), (9900, 7, 8)), 8) == ("STALL", "stalled")


def test_moving_but_the_lag_never_going_down_is_warn() -> None:
    """Burrow's rule 5: the position moves, the lag does not decrease once."""
    assert status(window((9000, 7, 3), (9400, 9, 3), (9900, 12, 8)), 8) == ("WARN", "lag-growing")


def test_moving_with_the_lag_going_down_once_is_ok() -> None:
    assert status(window((9000, 7, 3), (9400, 9, 6), (9900, 12, 4)), 8) == ("OK", "keeping-up")


def test_only_the_newest_window_counts() -> None:
    """A rewind older than the window no longer counts; the commits are sorted by time."""
    old = [Commit(8000 + i, 100 - i * 90, 5) for i in range(2)]  # 100 then 10: a rewind
    recent = [Commit(9000 + 100 * i, 10 + i, 5 + i) for i in range(WINDOW)]
    assert status(list(reversed(old + recent)), 20) == ("WARN", "lag-growing")


def test_over_a_threshold_an_ok_partition_is_warn_a_worse_one_stays() -> None:
    keeping_up = window((9000, 7, 3), (9400, 9, 6), (9900, 12, 4))
    assert status(keeping_up, 8, thresholds=Thresholds(max_lag=5)) == ("WARN", "threshold")
    assert status(keeping_up, 5, thresholds=Thresholds(max_lag=5)) == ("OK", "keeping-up")
    assert status(keeping_up, 8, lag_age_s=700, thresholds=Thresholds(max_lag_age_s=600)) == ("WARN", "threshold")
    assert status(keeping_up, 8, lag_age_s=None, thresholds=Thresholds(max_lag_age_s=600)) == ("OK", "keeping-up")
    stalled = window((9000, 7, 3), (9900, 7, 8))
    assert status(stalled, 8, thresholds=Thresholds(max_lag=5)) == ("STALL", "stalled")
    assert "lag 8 > 5" in partition_status(keeping_up, 8, NOW, thresholds=Thresholds(max_lag=5))["reason"]


def test_the_worst_partition_decides() -> None:
    verdicts = [{"status": "WARN", "partition": 0}, {"status": "STOP", "partition": 1}, {"status": "OK"}]
    assert worst(verdicts) == {"status": "STOP", "partition": 1}
    assert worst([])["status"] == "OK"


def test_thresholds_are_read_from_json_and_bad_ones_are_named() -> None:
    found = parse_thresholds({"d.t": {"max_lag": 1000, "max_lag_age_s": 90.5}, "group:g": {"max_lag": 0}})
    assert found == {"d.t": Thresholds(1000, 90.5), "group:g": Thresholds(0, None)}
    with pytest.raises(ValueError, match="JSON object"):
        parse_thresholds([1])
    with pytest.raises(ValueError, match=r"'d.t': max_lag must be a whole number"):
        parse_thresholds({"d.t": {"max_lag": 1.5}})
    with pytest.raises(ValueError, match="max_lag_age_s must be a number of seconds"):
        parse_thresholds({"d.t": {"max_lag_age_s": "10m"}})
    with pytest.raises(ValueError, match="unknown field.*max_age"):
        parse_thresholds({"d.t": {"max_age": 3}})
