"""How many cores the whole machine kept busy (/proc/stat) over a span named only afterwards,
and the CPU one process has used (/proc/<pid>/stat).

Every process counts, PostgreSQL and Redis as much as the worker: on a 2-core machine they
share the cores with it, so this tells a worker that could not scale from one whose database,
Redis or neighbours took the CPUs. Steal time counts as busy (the hypervisor took the core).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

Ticks = tuple[int, int]  # (all, idle + iowait) jiffies since boot, summed over the CPUs


def cpu_ticks() -> Ticks | None:
    """``Ticks`` now; None off Linux."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal; guest time after them is in user already.
    return sum(fields[:8]), fields[3] + fields[4]


def cores_busy(start: Ticks, end: Ticks, cpus: int) -> float | None:
    """Busy cores between two readings; None when no tick passed."""
    total, idle = end[0] - start[0], end[1] - start[1]
    return (total - idle) / total * cpus if total > 0 else None


def process_cpu(pid: int) -> float | None:
    """User and system CPU seconds of process ``pid`` so far (/proc/<pid>/stat, in the kernel's
    ticks); None if it cannot be read (another machine's pid, gone, off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    at: float  # time.time(), the clock run records are stamped with
    ticks: Ticks


class CpuSampler:
    """Reads ``/proc/stat`` every ``interval`` seconds on a thread while in its ``with`` block, so
    ``busy_between`` can answer for a span known only afterwards (the span of a round's run
    records in which every worker process worked). The kernel counts in ticks of 10 ms per
    core, so a span of a few seconds is measured to about one per cent."""

    def __init__(self, interval: float = 0.02, cpus: int | None = None) -> None:
        self.interval = interval
        self.cpus = cpus or os.cpu_count() or 1
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            ticks = cpu_ticks()
            if ticks is not None:
                self.samples.append(Sample(time.time(), ticks))
            if self._stop.wait(self.interval):
                return

    def busy_between(self, start: float, end: float) -> float | None:
        """Busy cores from the first sample at or after ``start`` to the last at or before
        ``end``; None when fewer than two samples fall inside (a span shorter than the interval,
        or nothing sampled)."""
        inside = [sample for sample in self.samples if start <= sample.at <= end]
        if len(inside) < 2:
            return None
        return cores_busy(inside[0].ticks, inside[-1].ticks, self.cpus)
