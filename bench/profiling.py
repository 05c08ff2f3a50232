"""Where the lane worker's time goes: a summary of the cProfile dump ``--profile`` asks for."""

from __future__ import annotations

import io
import pstats
from pathlib import Path

ROWS = 25


def loop_seconds(stats: pstats.Stats) -> float | None:
    """Cumulative time of the main thread's job loop, without start-up and shutdown (cProfile
    sees only the main thread: the claimer's and the writer's work is not in the dump)."""
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = getattr(stats, "stats", {})
    for (filename, _line, name), (_cc, _nc, _tt, cumulative, _callers) in raw.items():
        if name == "_run_in_main_thread" and filename.endswith("worker.py"):
            return cumulative
    return None


def summarise(path: Path, jobs: int, rows: int = ROWS) -> str:
    """Top functions by own time, then by cumulative time, and the loop's time per job.

    cProfile's clock is wall time, so waiting on the database or Redis is counted.
    """
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    loop = loop_seconds(stats)
    stats.strip_dirs()
    if loop is not None:
        out.write(
            f"job loop: {loop:.2f}s wall for {jobs} jobs = {loop / jobs * 1e6:.0f} us per job (profiled)\n"
        )
    for order in ("tottime", "cumulative"):
        out.write(f"\n--- by {order} ---\n")
        stats.sort_stats(order).print_stats(rows)
    return out.getvalue()
