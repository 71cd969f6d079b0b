"""Build the Python environment Spark executors need, without Airflow, as one archive to ship.

Executors run this package's Spark code (the ``liftbridge`` data source, ``publish_dataframe``'s
per-partition publisher, the streaming source and sink) but never its Airflow layer. Installing
``airflow-provider-liftbridge`` on every executor would pull Apache Airflow onto every node, so
this module packs a virtualenv holding only:

- the executor dependencies: grpcio, protobuf, nats-py, google-crc32c, pyarrow (pinned by default
  to the versions of the building environment, so the generated gRPC stubs match their runtime);
- this package's Airflow-free code: ``codec``, ``client``, ``spark``, ``_proto`` and the neutral
  modules they import (everything but the Airflow layer and the dev server), with its bytecode.

Ship it with ``spark.archives`` (``--archives``) and point executors' Python into it::

    python -m airflow_provider_liftbridge.spark.executor_env liftbridge-executor.tar.gz
    spark-submit --archives liftbridge-executor.tar.gz#lbenv \\
        --conf spark.pyspark.python=./lbenv/bin/python ...

The venv's ``bin/python`` is a copy of the interpreter that built it and finds its standard
library (and ``libpython``) at that interpreter's installation path, as with ``venv-pack``:
executors need the same Python installation at the same path (same image, or build with
``--python`` pointing at the cluster nodes' interpreter). PySpark itself is not packed: Spark
puts its own ``pyspark.zip`` on the executors' ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .errors import SparkOptionError

#: Distributions the executor code imports (and nothing else: no Airflow, no PySpark).
EXECUTOR_DISTRIBUTIONS = ("grpcio", "protobuf", "nats-py", "google-crc32c", "pyarrow")
#: Parts of ``airflow_provider_liftbridge`` left out of the archive: the Airflow layer, and the
#: dev server (executors never run it). Everything else (``codec``, ``client``, ``spark``,
#: ``_proto`` and the neutral top-level modules they import) is copied, so a new neutral module
#: cannot be forgotten; ``tests/spark/test_cluster.py`` checks the Airflow layer stays out.
AIRFLOW_LAYER = (
    "hooks",
    "operators",
    "sensors",
    "triggers",
    "queues",
    "ui",
    "exceptions.py",
    "validation.py",
    "lineage.py",
    "get_provider_info.py",
)
LEFT_OUT = (*AIRFLOW_LAYER, "devserver")
#: Written at the archive root: what was packed (read by :func:`describe`).
MANIFEST = "liftbridge-executor-env.json"
#: The alias the archive is unpacked under on executors, by default.
DEFAULT_ALIAS = "lbenv"
# Spark's unpacking keeps file modes for gzipped tars only (a plain .tar loses bin/python's x bit).
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


def executor_requirements(pin: bool = True, extra: Iterable[str] = ()) -> list[str]:
    """The pip requirements of the executor environment.

    :param pin: pin each distribution to the version installed here (``name==x.y.z``); a
        distribution that is not installed here is left unpinned.
    :param extra: more requirements to add as given (e.g. ``"pandas<3"`` for a pandas UDF).
    """
    requirements = []
    for name in EXECUTOR_DISTRIBUTIONS:
        try:
            requirements.append(f"{name}=={version(name)}" if pin else name)
        except PackageNotFoundError:
            requirements.append(name)
    return [*requirements, *extra]


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise RuntimeError(f"no lib/python*/site-packages in the new virtualenv {venv}")
    return found[0]


def _copy_package(site_packages: Path, python: Path) -> list[str]:
    """Copy this package's Airflow-free code into ``site_packages`` and compile its bytecode with
    the venv's ``python``; the names copied.

    Without bytecode in the archive, every executor of every application compiles the package
    (~23,000 lines) in its first Python worker, since each application unpacks the archive afresh.
    The ``.pyc`` files are checked against their source's hash, not its modification time, so they
    stay valid whatever times the unpacking gives the files (pip compiles the dependencies already).
    """
    source = _package_root()
    target = site_packages / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *LEFT_OUT))
    subprocess.run(
        [str(python), "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", str(target)], check=True
    )
    return sorted(entry.name for entry in target.iterdir() if entry.name != "__pycache__")


def build_executor_env(
    output: str | os.PathLike[str],
    *,
    python: str | None = None,
    requirements: Sequence[str] | None = None,
    pip_args: Sequence[str] = (),
    compresslevel: int = 6,
) -> Path:
    """Build the executor virtualenv and pack it into ``output`` (``.tar.gz`` or ``.tgz``).

    :param output: the archive to write.
    :param python: the interpreter the venv is based on (default: this one); executors need it at
        the same path.
    :param requirements: pip requirements (default: :func:`executor_requirements`).
    :param pip_args: more ``pip install`` arguments (an index URL, ``--no-index``...).
    :param compresslevel: gzip level, 1 (fastest) to 9 (smallest).
    :returns: the archive path.
    :raises SparkOptionError: on an archive name Spark cannot unpack.
    :raises subprocess.CalledProcessError: when creating the venv or installing into it fails.
    """
    target = Path(output).resolve()
    if not target.name.endswith(_ARCHIVE_SUFFIXES):
        raise SparkOptionError(
            f"the executor archive must end with one of {_ARCHIVE_SUFFIXES} (Spark unpacks those), got {target.name!r}"
        )
    reqs = list(requirements) if requirements is not None else executor_requirements()
    base = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="lb-executor-env-") as tmp:
        venv = Path(tmp) / "venv"
        # --copies: Spark refuses to unpack a symbolic link that points outside the archive, and a
        # venv's bin/python is one. No pip inside: the building pip installs with --python.
        subprocess.run([base, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True)
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet"]
        subprocess.run([*pip, *pip_args, *reqs], check=True)
        copied = _copy_package(_site_packages(venv), venv / "bin" / "python")
        manifest = {
            "requirements": reqs,
            "python": subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version.split()[0])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip(),
            "base_interpreter": os.path.realpath(venv / "bin" / "python"),
            "package": copied,
        }
        (venv / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(partial, "w:gz", compresslevel=compresslevel) as archive:
            # Entries relative to the venv root: Spark unpacks the archive into ./<alias>/.
            for entry in sorted(venv.iterdir()):
                archive.add(entry, arcname=entry.name)
        partial.replace(target)
    return target


def spark_config(archive: str | os.PathLike[str], alias: str = DEFAULT_ALIAS) -> dict[str, str]:
    """Spark settings that ship ``archive`` to the executors and run their Python from it.

    ``spark.pyspark.python`` is relative: on each executor Spark unpacks the archive into the
    working directory as ``<alias>``. In client mode the driver JVM starts Python data source
    planning workers from the same setting: ``build_spark_session`` starts it in
    :func:`driver_directory`, where the archive is unpacked too.
    """
    return {
        "spark.archives": f"{Path(archive).resolve()}#{alias}",
        "spark.pyspark.python": f"./{alias}/bin/python",
    }


def archive_for_python(python: str, archives: str) -> tuple[str, str] | None:
    """The ``(archive, alias)`` of ``spark.archives`` that a relative ``spark.pyspark.python``
    (``./<alias>/...``) runs from, or ``None`` (absolute path, or no archive with that alias)."""
    if not python.startswith("./"):
        return None
    alias = python[2:].split("/", 1)[0]
    for entry in archives.split(","):
        path, _, name = entry.strip().partition("#")
        if name == alias and path:
            return path.removeprefix("file://"), alias
    return None


def driver_directory_path(archive: str | os.PathLike[str], alias: str = DEFAULT_ALIAS) -> Path:
    """Where :func:`driver_directory` unpacks ``archive`` (whether it did yet or not); remove it
    when the archive is no longer used (it is about 200 MB)."""
    source = Path(archive).resolve()
    stat = source.stat()
    key = hashlib.sha256(f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{alias}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"liftbridge-spark-driver-{key}"


def driver_directory(archive: str | os.PathLike[str], alias: str = DEFAULT_ALIAS) -> Path:
    """A directory holding ``archive`` unpacked as ``<alias>``: the driver JVM's working directory
    in client mode (see ``session.build_spark_session``).

    Unpacked once per archive path, size and modification time, under the system temporary
    directory; later calls return the same directory.
    """
    source = Path(archive).resolve()
    directory = driver_directory_path(source, alias)
    if (directory / alias / MANIFEST).exists():
        return directory
    staging = Path(tempfile.mkdtemp(prefix="liftbridge-spark-driver-"))
    with tarfile.open(source) as packed:
        packed.extractall(staging / alias, filter="tar")
    try:
        staging.rename(directory)
    except OSError:  # another process unpacked it first
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def describe(archive: str | os.PathLike[str]) -> Mapping[str, object]:
    """The manifest stored in an executor archive (requirements, Python version, base interpreter)."""
    with tarfile.open(archive) as packed:
        member = packed.extractfile(MANIFEST)
        if member is None:
            raise SparkOptionError(f"{archive} has no {MANIFEST}: it was not built by this command")
        data: Mapping[str, object] = json.load(member)
        return data


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the archive and print the Spark settings that use it."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_liftbridge.spark.executor_env",
        description="Pack a virtualenv with the Liftbridge executor code and its dependencies (no Airflow) "
        "for spark.archives / --archives.",
    )
    parser.add_argument("output", help="archive to write: NAME.tar.gz or NAME.tgz")
    parser.add_argument("--python", help="base interpreter (default: this one); executors need it at the same path")
    parser.add_argument("--no-pin", action="store_true", help="do not pin dependencies to the versions installed here")
    parser.add_argument("--requirement", action="append", default=[], help="an extra pip requirement (repeatable)")
    parser.add_argument("--pip-arg", action="append", default=[], help="an extra pip install argument (repeatable)")
    parser.add_argument("--compress-level", type=int, default=6, help="gzip level 1-9 (default: %(default)s)")
    parser.add_argument("--alias", default=DEFAULT_ALIAS, help="directory name on executors (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        archive = build_executor_env(
            args.output,
            python=args.python,
            requirements=executor_requirements(pin=not args.no_pin, extra=args.requirement),
            pip_args=args.pip_arg,
            compresslevel=args.compress_level,
        )
    except SparkOptionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}", file=sys.stderr)
        return 1
    for key, value in spark_config(archive, args.alias).items():
        print(f"--conf {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
