"""Add bytecode to the ``pyspark.zip`` that Spark puts first on its Python workers' path.

Spark starts some Python workers itself (the streaming source's runner, any worker when the
daemon is off) and gives each a fixed 10 s to connect back to the JVM. Those workers import
PySpark from ``$SPARK_HOME/python/lib/pyspark.zip``, which ships sources only: every start
compiles PySpark's modules again (about 0.7 s of CPU here against 0.35 s with bytecode), and on a
machine loaded several times over its cores that alone can pass the 10 s (docs/testing.md, the
Spark connect-back row). This writes an unchecked hash-based ``.pyc`` beside every ``.py`` of the
archive (``zipimport`` uses such a ``.pyc`` without comparing times), keeps the sources for
tracebacks, and replaces the archive atomically. Running it again does nothing.

Usage: ``python scripts/compile_pyspark_zip.py`` (the ``pyspark`` installed for this interpreter).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import zipfile
from pathlib import Path


def compile_archive(archive: Path) -> int:
    """Write ``archive`` again with a ``.pyc`` for every ``.py`` that lacks one; the number added."""
    with zipfile.ZipFile(archive) as zin:
        names = set(zin.namelist())
        todo = [n for n in names if n.endswith(".py") and n + "c" not in names]
        if not todo:
            return 0
        fd, tmp = tempfile.mkstemp(dir=archive.parent, suffix=".tmp")
        os.close(fd)
        added = 0
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
                for info in zin.infolist():
                    source = zin.read(info)
                    zout.writestr(info, source)
                    if info.filename in todo:
                        try:
                            code = compile(source, info.filename, "exec", dont_inherit=True)
                        except SyntaxError:
                            continue  # a template or a file for another Python: left as it is
                        # PEP 552 header: flags 0b01 = hash-based, not checked against the source.
                        header = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")
                        pyc = header + importlib.util.source_hash(source) + marshal.dumps(code)
                        zout.writestr(zipfile.ZipInfo(info.filename + "c", date_time=info.date_time), pyc)
                        added += 1
            os.chmod(tmp, archive.stat().st_mode & 0o777)
            os.replace(tmp, archive)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return added


def main() -> int:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        print("compile_pyspark_zip: pyspark is not installed for this interpreter; nothing to do", file=sys.stderr)
        return 0
    archive = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    if not archive.is_file():
        print(f"compile_pyspark_zip: no {archive}; nothing to do", file=sys.stderr)
        return 0
    added = compile_archive(archive)
    if added:
        print(
            f"setup: compiled {added} PySpark module(s) into {archive} (Spark's Python workers import them from there)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
