"""The standalone test cluster and the executor archive: executors run the archive's Python, in
which Airflow cannot be imported, and the package's executor code comes from the archive."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.spark import SparkOptionError
from airflow_provider_liftbridge.spark.executor_env import (
    AIRFLOW_LAYER,
    EXECUTOR_DISTRIBUTIONS,
    archive_for_python,
    build_executor_env,
    describe,
    main,
)

pytestmark = pytest.mark.spark


def executor_probe(_: Iterator[Any]) -> Iterator[tuple[str, bool, str, str]]:
    """Where an executor's Python runs from, whether it can import Airflow, where this package is."""
    import importlib.util
    import os
    import sys

    import airflow_provider_liftbridge

    yield (
        sys.executable,
        importlib.util.find_spec("airflow") is not None,
        airflow_provider_liftbridge.__file__ or "",
        os.getcwd(),
    )


# Ship the probe by value: the executors cannot import this test module.
executor_probe.__module__ = "__main__"


def test_executors_run_the_archive_python_without_airflow(spark: SparkSession) -> None:
    assert spark.sparkContext.master.startswith("spark://")
    seen = spark.sparkContext.parallelize(range(4), 4).mapPartitions(executor_probe).collect()

    assert len(seen) == 4
    for executable, airflow_importable, package_file, cwd in seen:
        # Spark unpacked the archive into the executor's working directory as ./lbenv.
        assert executable == "./lbenv/bin/python" or executable.startswith(cwd + "/lbenv/"), executable
        assert not airflow_importable
        assert package_file.startswith(cwd + "/lbenv/lib/"), package_file
    # Two executors, one per worker: every worker ran Python tasks from its own directory.
    assert len({cwd for *_, cwd in seen}) == 2


def test_archive_holds_only_the_executor_code_and_its_dependencies(executor_archive: Path) -> None:
    with tarfile.open(executor_archive) as packed:
        names = packed.getnames()
        links = [m for m in packed.getmembers() if m.issym() and m.linkname.startswith("/")]
        airflow_imports = [
            m.name
            for m in packed.getmembers()
            if "/airflow_provider_liftbridge/" in m.name
            and m.name.endswith(".py")
            and re.search(rb"^\s*(from|import) airflow\b", packed.extractfile(m).read(), re.M)  # type: ignore[union-attr]
        ]
    assert airflow_imports == []
    assert links == []  # Spark refuses to unpack links that leave the archive
    package = [n for n in names if "/site-packages/airflow_provider_liftbridge/" in n]
    top = {n.split("/airflow_provider_liftbridge/")[1].split("/")[0] for n in package} - {"__pycache__"}
    assert {"__init__.py", "_proto", "codec", "client", "spark"} <= top
    assert not top & {*AIRFLOW_LAYER, "devserver"}
    assert describe(executor_archive)["package"] == sorted(top)
    assert not [n for n in names if "/site-packages/airflow/" in n or "/site-packages/pyspark/" in n]
    manifest = describe(executor_archive)
    assert [r.split("==")[0] for r in manifest["requirements"]] == list(EXECUTOR_DISTRIBUTIONS)  # type: ignore[union-attr]


def test_archive_holds_the_package_bytecode_checked_by_source_hash(executor_archive: Path) -> None:
    # Each application unpacks the archive afresh: without bytecode, every executor's first Python
    # worker would compile the package again. Checked by hash, it stays valid whatever file times
    # the unpacking gives.
    tag = sys.implementation.cache_tag
    with tarfile.open(executor_archive) as packed:
        names = set(packed.getnames())
        sources = [n for n in names if "/site-packages/airflow_provider_liftbridge/" in n and n.endswith(".py")]
        missing, flags = [], set()
        for source in sources:
            folder, _, name = source.rpartition("/")
            compiled = f"{folder}/__pycache__/{name[:-3]}.{tag}.pyc"
            if compiled not in names:
                missing.append(source)
                continue
            header = packed.extractfile(compiled).read(8)  # type: ignore[union-attr]
            flags.add(int.from_bytes(header[4:8], "little"))
    assert len(sources) > 100
    assert missing == []
    assert flags == {0b11}  # PEP 552: hash-based, checked


def test_the_command_refuses_an_archive_name_spark_cannot_unpack(tmp_path: Path) -> None:
    with pytest.raises(SparkOptionError, match="must end with one of"):
        build_executor_env(tmp_path / "env.zip")
    assert main([str(tmp_path / "env.tar")]) == 2


def test_the_command_line_prints_the_spark_settings(executor_archive: Path) -> None:
    # The module runs as a command (python -m); --help lists its options without building anything.
    out = subprocess.run(
        [sys.executable, "-m", "airflow_provider_liftbridge.spark.executor_env", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "--python" in out and "spark.archives" in out
    assert archive_for_python("./lbenv/bin/python", f"{executor_archive}#lbenv") == (str(executor_archive), "lbenv")
    assert archive_for_python("/usr/bin/python3", f"{executor_archive}#lbenv") is None
