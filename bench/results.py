"""What one measurement produced, in a shape the table and BENCHMARKS.md both read."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Rate:
    """``jobs`` handled in each of ``seconds`` (one entry per round); the median round counts."""

    label: str
    jobs: int
    seconds: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def per_second(self) -> float:
        return self.jobs / statistics.median(self.seconds)

    @property
    def spread(self) -> str:
        """Slowest..fastest round in jobs/s, so noise between rounds is visible."""
        if len(self.seconds) < 2:
            return ""
        return f"{self.jobs / max(self.seconds):,.0f}..{self.jobs / min(self.seconds):,.0f}"


@dataclass(frozen=True)
class Ratio:
    """``value`` against a lower bound ``target``; no target: shown for reference only."""

    label: str
    value: float
    target: float | None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.value >= self.target


@dataclass(frozen=True)
class CommandCount:
    """Redis commands per job for one side of one system, with the busiest commands."""

    label: str
    jobs: int
    total: int
    scripts: int  # EVAL/EVALSHA calls: one round trip each, their inner commands counted too
    top: list[tuple[str, int]]
    target: float | None = None

    @property
    def per_job(self) -> float:
        return self.total / self.jobs

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.per_job <= self.target

    def top_text(self, limit: int = 8) -> str:
        return ", ".join(f"{name} {calls / self.jobs:.2g}" for name, calls in self.top[:limit])


@dataclass(frozen=True)
class Figure:
    """One tenancy figure (bench/tenancy.py), formatted where it is measured: the measurements
    differ in kind (latencies, rates, ratios either way round), so each carries its own text."""

    label: str
    value: str
    target: str = ""
    met: bool | None = None
    how: str = ""


@dataclass
class Report:
    facts: dict[str, str]
    command: str
    rates: list[Rate] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    commands: list[CommandCount] = field(default_factory=list)
    tenancy: list[Figure] = field(default_factory=list)
    console: list[Figure] = field(default_factory=list)
    schedules: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
