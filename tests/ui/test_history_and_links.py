"""The run history the view charts (written by real consume runs on the session dev server, read
through the view's endpoint behind Airflow's auth), the operators' extra links into the view,
and what loading the plugin costs a task process."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import HISTORY_STREAM, PartitionRun, RunEntry, read_history, record_run
from airflow_provider_liftbridge.client.reading.history import HISTORY_MAX_MESSAGES
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.links import PIPELINE_LINK, STREAM_LINK, view_installed
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.ui.paths import view_url
from tests.airflow_support import REPO
from tests.processes import run_child
from tests.ui.test_api import Api, airflow_app, connections, run_consume, token  # noqa: F401  (fixtures too)

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]


def pipeline_history(body: dict[str, Any], stream: str) -> dict[str, Any]:
    [found] = [p for p in body["pipelines"] if p["stream"] == stream]
    return found


def test_each_run_adds_a_history_entry_the_charts_show(
    airflow_app: Any,  # noqa: F811  (the imported fixtures)
    stream_name: str,
    lb_address: str,
    connections: Any,  # noqa: F811
) -> None:
    """Three runs read 3, 2 and 0 messages of partition 0 and 1, 0 and 0 of partition 1: the
    history answer has the three runs with what each read and the lag it left, and the stream's
    message rate between them."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        client.publish_many(stream_name, [b'{"n": 0}'] * 3, partition=0)
        client.publish(stream_name, b'{"n": 1}', partition=1)
    run_consume(stream_name)
    with LiftbridgeClient(lb_address) as client:
        client.publish_many(stream_name, [b'{"n": 2}'] * 2, partition=0)
    run_consume(stream_name)
    run_consume(stream_name)

    body = Api(airflow_app, token("op")).get("/api/connections/liftbridge_default/history")
    pipeline = pipeline_history(body, stream_name)
    assert (pipeline["dag_id"], pipeline["task_id"], pipeline["partitions"]) == (f"ui_{stream_name}", "consume", [0, 1])
    runs = pipeline["runs"]
    assert [r["partitions"]["0"]["processed"] for r in runs] == [3, 2, 0]
    assert [r["partitions"]["1"]["processed"] for r in runs] == [1, 0, 0]
    assert all(r["partitions"][p]["lag"] == 0 for r in runs for p in ("0", "1"))
    assert len({r["run_id"] for r in runs}) == 3
    assert [r["time"] for r in runs] == sorted(r["time"] for r in runs)
    [rates] = [s for s in body["streams"] if s["stream"] == stream_name]
    assert rates["messages"] == 6
    assert len(rates["points"]) == 2 and all(point["rate"] >= 0 for point in rates["points"])
    assert rates["points"][0]["messages"] == 6


def test_the_history_is_bounded_and_skips_what_is_not_an_entry(stream_name: str, lb_address: str) -> None:
    """The history stream is created retention-limited; a message that is not an entry is skipped;
    the newest ``limit`` entries come back, oldest first."""
    history = f"{stream_name}-history"
    with LiftbridgeClient(lb_address) as client:
        for i in range(4):
            entry = RunEntry(
                dag_id="d",
                task_id="t",
                run_id=f"run-{i}",
                stream=stream_name,
                partitions={0: PartitionRun(processed=i, dead_lettered=0, lag=4 - i, high_watermark=10 + i)},
                recorded_at=1_000 + i,
            )
            record_run(client, entry, stream=history)
        client.publish(history, b"not an entry")
        found = read_history(client, limit=3, stream=history)
        assert [e.run_id for e in found] == ["run-2", "run-3"]  # the junk took one of the three places
        assert found[-1].partitions[0] == PartitionRun(processed=3, dead_lettered=0, lag=1, high_watermark=13)
        assert HISTORY_STREAM != history and HISTORY_MAX_MESSAGES > 0


def test_extra_links_open_the_view_at_the_stream_and_the_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built from ``[api] base_url`` (here under a path prefix), in Airflow's frame at
    ``plugin/liftbridge``; the publish operator has the stream link only."""
    from airflow.models.taskinstancekey import TaskInstanceKey

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://host.example/airflow/")
    assert view_installed()
    consume = LiftbridgeConsumeOperator(
        task_id="read",
        stream="orders",
        read=SinceLastRun("c"),
        apply_function="tests.ui.ui_support.accept",
        liftbridge_conn_id="lb_prod",
    )
    key = TaskInstanceKey(dag_id="shop", task_id="read", run_id="r1")
    links = {link.name: link for link in consume.operator_extra_links}
    assert set(links) == {STREAM_LINK, PIPELINE_LINK}
    assert links[PIPELINE_LINK].get_link(consume, ti_key=key) == (
        "https://host.example/airflow/plugin/liftbridge/airflow/liftbridge/?conn=lb_prod&tab=pipelines&pipeline=shop.read"
    )
    assert links[STREAM_LINK].get_link(consume, ti_key=key) == (
        "https://host.example/airflow/plugin/liftbridge/airflow/liftbridge/?conn=lb_prod&tab=browse&stream=orders"
    )
    publish = LiftbridgePublishOperator(task_id="pub", stream="orders", records=[])
    assert [link.name for link in publish.operator_extra_links] == [STREAM_LINK]
    assert view_url("") == "/plugin/liftbridge/liftbridge/"
    assert (
        view_url("http://127.0.0.1:8080", tab="charts")
        == "http://127.0.0.1:8080/plugin/liftbridge/liftbridge/?tab=charts"
    )


def test_a_task_process_loads_the_plugin_without_the_views_app(tmp_path: Any) -> None:
    """Airflow loads plugins in every task process (for their macros): the view's plugin is among
    them, with Airflow's default configuration, and its app (FastAPI routes, the client's view
    model) is not imported there."""
    script = textwrap.dedent(
        """
        import sys
        from airflow.sdk import plugins_manager
        names = [p.name for p in plugins_manager._get_plugins()[0]]
        print("LOADED", "liftbridge_ui" in names)
        print("APP", sorted(m for m in sys.modules if m.startswith("airflow_provider_liftbridge.ui.")))
        print("FROM", sys.modules["airflow_provider_liftbridge"].__file__)
        """
    )
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),  # this checkout, whatever an editable install points at
    }
    # -P: the working directory is not on sys.path, as for the airflow command. A source
    # checkout's *.egg-info there is a second copy of this distribution, whose entry point
    # would register the plugin again.
    done = run_child([sys.executable, "-P", "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED True" in done.stdout, done.stdout[-2000:]
    assert "APP ['airflow_provider_liftbridge.ui.paths', 'airflow_provider_liftbridge.ui.plugin']" in done.stdout, (
        done.stdout[-2000:]
    )
    assert f"FROM {REPO / 'airflow_provider_liftbridge' / '__init__.py'}" in done.stdout, done.stdout[-2000:]


def test_the_page_loads_everything_from_the_package_by_relative_addresses(airflow_app: Any) -> None:  # noqa: F811
    """The page, its script and style and the chart library come from the view itself (no CDN:
    the api-server may have no internet), each address relative (no leading ``/``, no host), so
    the page works under Airflow's base URL path."""
    import re

    from fastapi.testclient import TestClient

    client = TestClient(airflow_app)
    page = client.get("/liftbridge/")
    assert page.status_code == 200
    addresses = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert addresses and all(not a.startswith(("/", "http:", "https:", "//")) for a in addresses), addresses
    for address in addresses:
        served = client.get(f"/liftbridge/{address}")
        assert served.status_code == 200 and served.content, address
    script = client.get("/liftbridge/static/app.js").text
    assert "http://" not in script and "https://" not in script
    assert not re.search(r"""fetch\(\s*[`'"]/""", script)  # every fetch relative to the page


def test_no_link_where_the_view_is_not_installed(tmp_path: Any) -> None:
    """An installation whose metadata for this package has no ``airflow.plugins`` entry point
    (as a build before the view had one): the view is not registered there, and the links are
    empty, so Airflow shows no button. (Python takes a distribution's first metadata found on
    ``sys.path``: a dist-info without the entry point, put first, stands for that installation.)"""
    dist = tmp_path / "site" / "airflow_provider_liftbridge-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: airflow-provider-liftbridge\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[apache_airflow_provider]\nprovider_info = airflow_provider_liftbridge.get_provider_info:get_provider_info\n"
    )
    script = textwrap.dedent(
        """
        from airflow.models.taskinstancekey import TaskInstanceKey
        from airflow_provider_liftbridge.operators import links
        from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
        op = LiftbridgePublishOperator(task_id="pub", stream="orders", records=[])
        key = TaskInstanceKey(dag_id="d", task_id="pub", run_id="r")
        print("INSTALLED", links.view_installed())
        kinds = (links.LiftbridgeStreamLink(), links.LiftbridgePipelineLink())
        made = [link.get_link(op, ti_key=key) for link in kinds]
        print("LINKS", made)
        """
    )
    env = {
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path / 'site'}:{REPO}",
    }
    # -P: the working directory is not on sys.path, as for the airflow command. A source
    # checkout's *.egg-info there is a second copy of this distribution, whose entry point
    # would register the plugin again.
    done = run_child([sys.executable, "-P", "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "INSTALLED False" in done.stdout and "LINKS ['', '']" in done.stdout, done.stdout[-2000:]


def test_bookkeeping_streams_are_made_of_segments_their_retention_can_remove(
    stream_name: str, lb_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Liftbridge's retention removes whole segments and never the newest (as the dev server's):
    a bookkeeping stream is created with segments of ``BOOKKEEPING_SEGMENT_BYTES``, so its limits
    hold. Here a segment holds one entry and the limit is 3 entries: the oldest go. With the
    server's default segments (the stream created without the setting) all 10 stayed."""
    import datetime as dt

    from airflow_provider_liftbridge.client.reading import registry
    from tests.exact_retention import wait_for_earliest

    monkeypatch.setattr(registry, "BOOKKEEPING_SEGMENT_BYTES", 1)
    limits = {"retention_max_messages": 3, "cleaner_interval": dt.timedelta(milliseconds=100)}
    with LiftbridgeClient(lb_address) as client:
        for i in range(10):
            registry.publish_entry(client, stream_name, b"k%d" % i, b'{"n": %d}' % i, **limits)
        wait_for_earliest(client, stream_name, 7)
