"""A pipeline reading by interval in the Liftbridge view (docs/ui.md), under the system tier's
deployment, in headless Chromium: two runs of the interval example (``liftbridge_interval_archive``,
``read=DataInterval()``), each given an explicit data interval in the REST API's trigger (the
example is hourly with two minutes of allowed lateness: a run of a whole past hour would need an
hour of real timestamps) of a few seconds of real messages on a fresh two-partition stream. Then,
in the browser: the pipelines tab lists ``archive_hour`` with its latest interval, read, and its
progress; the charts have a point per run with the two intervals; the task instance's "Liftbridge
pipeline" link opens the view at it, outlined.

A module of its own, with its own browser: it does not need the stream-archive runs the other
view tests wait for. Screenshots go to the deployment's log folder.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment, wait_until
from tests.system.test_ui import logged_in_page

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
DAG_ID = "liftbridge_interval_archive"
TASK_ID = "archive_hour"
NAME = f"{DAG_ID}.{TASK_ID}"
#: Per interval, the messages published in it on partitions 0 and 1.
COUNTS = ({0: 3, 1: 2}, {0: 1, 1: 2})


@dataclass(frozen=True)
class IntervalRuns:
    """What the fixture did: the stream, the intervals (ISO 8601, as the view shows them), the run
    ids, per interval and partition the offsets published in it, and the offsets after the last."""

    stream: str
    intervals: list[tuple[str, str]]
    run_ids: list[str]
    offsets: list[dict[int, list[int]]]
    after: dict[int, int]


def iso(ms: int) -> str:
    """Milliseconds since the epoch as the view's ISO 8601 text (``Interval.to_dict``)."""
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)).isoformat()


def next_ms(ns: int) -> int:
    """The first whole millisecond after ``ns``."""
    return ns // 1_000_000 + 1


def wait_for_clock(ms: int) -> None:
    wait_until(
        "the clock to pass an interval's end", lambda: time.time_ns() >= ms * 1_000_000, timeout=5, interval=0.001
    )


@pytest.fixture(scope="module")
def interval_runs(deployment: Deployment) -> IntervalRuns:
    """Two back-to-back intervals of real timestamps on a fresh stream (whole milliseconds: what
    the registry keeps), each holding the :data:`COUNTS` messages, then one message after them on
    each partition, so both are complete at once; a run of the example per interval, one after the
    other (so the registry's newest entry is the second's)."""
    deployment.wait_for_dags([DAG_ID])
    stream = f"sensor-view-{uuid.uuid4().hex[:8]}"
    bounds: list[int] = []
    offsets: list[dict[int, list[int]]] = []
    with LiftbridgeClient(deployment.devserver.address) as client:
        client.create_stream(stream, stream, partitions=2)
        bounds.append(time.time_ns() // 1_000_000)  # at or before the first message's reception
        for counts in COUNTS:
            stamps, published = [], {}
            for partition, count in counts.items():
                acks = [
                    client.publish(stream, json.dumps({"n": n}).encode(), partition=partition) for n in range(count)
                ]
                published[partition] = [ack.offset for ack in acks if ack is not None]
                stamps += [ack.reception_timestamp for ack in acks if ack is not None]
            offsets.append(published)
            bounds.append(next_ms(max(stamps)))
            wait_for_clock(bounds[-1])  # the next messages are after this interval's end
        after = {p: client.publish(stream, b'{"n": "after"}', partition=p).offset for p in (0, 1)}  # type: ignore[union-attr]
    run_ids = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        body = deployment.api(
            "POST",
            f"/dags/{DAG_ID}/dagRuns",
            {
                "logical_date": iso(end),
                "data_interval_start": iso(start),
                "data_interval_end": iso(end),
                "conf": {"stream": stream, "archive_url": (deployment.home / "interval-lake" / stream).as_uri()},
            },
        )
        run_id = str(body["dag_run_id"])
        state = deployment.wait_for_run(DAG_ID, run_id, timeout=600)
        assert state == "success", f"{deployment.task_states(DAG_ID, run_id)} (logs: {deployment.log_dir})"
        run_ids.append(run_id)
    intervals = [(iso(start), iso(end)) for start, end in zip(bounds, bounds[1:], strict=False)]
    return IntervalRuns(stream, intervals, run_ids, offsets, after)


@pytest.fixture(scope="module")
def page(deployment: Deployment, interval_runs: IntervalRuns) -> Iterator[Any]:
    with logged_in_page(deployment.url) as logged_in:
        yield logged_in


def test_the_interval_pipeline_is_listed_with_its_interval(
    deployment: Deployment, page: Any, interval_runs: IntervalRuns
) -> None:
    """Its heading names the second run's interval, read; per partition the progress is the
    interval's last offset and the lag the one message after it."""
    from playwright.sync_api import expect

    runs = interval_runs
    start, end = runs.intervals[-1]
    try:
        page.goto(f"{deployment.url}/liftbridge/?tab=pipelines&filter={runs.stream}")
        heading = page.locator(f'h2[data-pipeline="{NAME}"][data-stream="{runs.stream}"]')
        expect(heading).to_have_attribute("data-mode", "DataInterval")
        span = heading.locator("[data-interval]")
        expect(span).to_have_attribute("data-interval-start", start)
        expect(span).to_have_attribute("data-interval-end", end)
        expect(heading).to_contain_text("(read)")
        expect(heading.locator("[data-lag]")).to_have_text("2")  # one message after the interval per partition
        table = page.locator(f'table[data-pipeline-table="{NAME}"][data-stream="{runs.stream}"]')
        for partition, published in runs.offsets[-1].items():
            row = table.locator(f'tr[data-partition="{partition}"]')
            expect(row.locator("td").nth(1)).to_have_text(str(published[-1]))  # the progress
            expect(row.locator("td").nth(2)).to_have_text(str(runs.after[partition]))  # the high watermark
            expect(row.locator("td[data-lag]")).to_have_text("1")
            expect(row.locator("td").nth(6)).to_contain_text(f"{published[0]}..{published[-1]}")
    finally:
        page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-interval-pipeline.png"), full_page=True)


def test_the_interval_pipelines_charts_have_a_point_per_run_with_its_interval(
    deployment: Deployment, page: Any, interval_runs: IntervalRuns
) -> None:
    from playwright.sync_api import expect

    runs = interval_runs
    try:
        page.goto(f"{deployment.url}/liftbridge/?tab=charts&filter={runs.stream}")
        heading = page.locator(f'h2[data-chart-pipeline="{NAME}"][data-stream="{runs.stream}"]')
        expect(heading).to_have_attribute("data-runs", "2")
        expect(heading).to_have_attribute("data-by-interval", "true")
        section = heading.locator("xpath=following-sibling::div[1]")
        expect(section.locator('[data-chart="lag"] canvas')).to_have_count(1)
        expect(section.locator('[data-chart="processed"] canvas')).to_have_count(1)
        listed = page.locator(f'table[data-runs-of="{NAME}"][data-stream="{runs.stream}"] tbody tr')
        expect(listed).to_have_count(2)
        for n, ((start, _), counts) in enumerate(zip(runs.intervals, COUNTS, strict=True)):
            row = listed.nth(n)  # in interval order
            expect(row).to_have_attribute("data-run-interval", start)
            expect(row.locator("td").nth(1)).to_have_text(runs.run_ids[n])
            expect(row.locator("td").nth(2)).to_have_text(str(sum(counts.values())))
        # uPlot drew the points: its data holds a value per run for each partition.
        drawn = page.evaluate(
            """name => window.liftbridgeView.charts
                .filter(c => c.box.closest('.charts').previousElementSibling.dataset.chartPipeline === name
                             && c.box.dataset.chart === 'processed')
                .map(c => c.plot.data.slice(1).map(values => values.filter(v => v != null).length))""",
            NAME,
        )
        assert drawn == [[2, 2]], drawn
    finally:
        page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-interval-charts.png"), full_page=True)


def test_the_task_instances_extra_link_outlines_the_interval_pipeline(
    deployment: Deployment, page: Any, interval_runs: IntervalRuns
) -> None:
    """The "Liftbridge pipeline" button of ``archive_hour``'s task instance opens the view, in
    Airflow's frame, with the pipeline outlined."""
    from playwright.sync_api import expect

    run_id = interval_runs.run_ids[-1]
    links = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/links")
    assert set(links["extra_links"]) == {"Liftbridge pipeline", "Liftbridge stream"}, links
    page.goto(f"{deployment.url}/dags/{DAG_ID}/runs/{run_id}/tasks/{TASK_ID}/details")
    try:
        page.get_by_role("link", name="Liftbridge pipeline").click()  # same origin: opens in the window
        page.wait_for_url(lambda at: "/plugin/liftbridge" in at)
        frame = page.frame_locator("iframe")
        focused = frame.locator(f'h2.focused[data-pipeline="{NAME}"][data-stream="{interval_runs.stream}"]')
        expect(focused).to_be_visible()
        expect(focused.locator("[data-interval]")).to_have_attribute(
            "data-interval-start", interval_runs.intervals[-1][0]
        )
        expect(frame.locator("#focus-missing")).to_have_count(0)
    finally:
        page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-interval-extra-link.png"), full_page=True)


def test_a_link_to_a_pipeline_not_in_the_registry_says_so(deployment: Deployment, page: Any) -> None:
    """The view opened at a task that never recorded itself names it and says when it will show up,
    above the pipelines it does list."""
    from playwright.sync_api import expect

    page.goto(f"{deployment.url}/liftbridge/?tab=pipelines&pipeline=no_such_dag.no_such_task")
    missing = page.locator("#focus-missing")
    expect(missing).to_contain_text("No pipeline no_such_dag.no_such_task in the registry")
    expect(missing).to_contain_text("after its next run")
    expect(page.locator(f'h2[data-pipeline="{NAME}"]').first).to_be_visible()
    expect(page.locator("h2.focused")).to_have_count(0)
