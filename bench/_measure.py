"""What every benchmark script reports beside its figures: the CPU time of other processes and
the machine it ran on. Imports nothing from the project, so gufo's worker can use it too."""

from __future__ import annotations

import os
import platform

import psutil


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` so far (a process that is gone counts 0)."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPU model, cores, Python, OS."""
    python, system = platform.python_version(), f"{platform.system()} {platform.release()}"
    return f"{cpu_model()}; nproc {os.cpu_count()}; Python {python}; {system}"
