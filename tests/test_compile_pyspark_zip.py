"""``scripts/compile_pyspark_zip.py``: the archive gets bytecode that ``zipimport`` really uses,
the sources stay, and a second run changes nothing."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.airflow_support import REPO

sys.path.insert(0, str(REPO / "scripts"))
from compile_pyspark_zip import compile_archive  # noqa: E402


def _import_x(archive: Path) -> str:
    code = f"import sys; sys.path.insert(0, {str(archive)!r}); import pkg.mod as m; print(m.X, m.__file__)"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def test_the_archive_gets_bytecode_that_zipimport_uses(tmp_path: Path) -> None:
    archive = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", "X = 1\n")
        z.writestr("pkg/broken.py", "def (:\n")  # not Python 3.11: kept, not compiled

    assert compile_archive(archive) == 2
    with zipfile.ZipFile(archive) as z:
        assert sorted(z.namelist()) == [
            "pkg/__init__.py",
            "pkg/__init__.pyc",
            "pkg/broken.py",
            "pkg/mod.py",
            "pkg/mod.pyc",
        ]
    assert compile_archive(archive) == 0  # a second run does nothing

    # The source changed behind the bytecode's back: the import still gives the compiled X, so
    # zipimport took the .pyc (unchecked hash-based) and compiled nothing.
    with zipfile.ZipFile(archive) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    entries["pkg/mod.py"] = b"X = 2\n"
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    assert _import_x(archive).startswith("1 ")
