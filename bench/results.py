"""What one measurement produced, in a shape the table and BENCHMARKS.md both read."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
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


def paired_ratios(a: Rate, b: Rate) -> list[float]:
    """a's rate over b's, round by round: round i of each side ran back to back, so a burst of
    load from a neighbour slows both sides of the pair alike (a ratio of the two medians pairs
    rounds that ran at different times)."""
    if len(a.seconds) != len(b.seconds):
        raise ValueError(f"{a.label} and {b.label} ran {len(a.seconds)} and {len(b.seconds)} rounds")
    return [(a.jobs / sa) / (b.jobs / sb) for sa, sb in zip(a.seconds, b.seconds, strict=True)]


# The most decimals a ratio is shown with, unless its format asks for more (see Ratio.shown).
MAX_DIGITS = 4


@dataclass(frozen=True)
class Ratio:
    """``value`` against a lower bound ``target`` (an upper bound with ``at_most``); no target:
    shown for reference only. Counts (``fmt="d"``) share the table with the ratios."""

    label: str
    value: float
    target: float | None
    at_most: bool = False
    fmt: str = ".2f"

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self._met_by(self.value)

    @property
    def bound(self) -> str:
        return "" if self.target is None else f"{'<=' if self.at_most else '>='} {self.target:g}"

    @property
    def shown(self) -> str:
        if self.fmt == "d":
            return format(int(self.value), "d")
        if self.target is None:
            return format(self.value, self.fmt)
        # 0.998 against ">= 1" would read "1.00 ... NO": more digits until the figure shown
        # falls on the same side of the target as the value.
        first = int(self.fmt.strip(".f"))
        most = max(first, MAX_DIGITS)
        for digits in range(first, most):
            shown = format(self.value, f".{digits}f")
            if self._met_by(float(shown)) == self.met:
                return shown
        # Cut off rather than rounded, towards the side the value is on: 0.99999 is "0.9999",
        # not "1.0000".
        scale = 10**most
        cut = math.floor if self.met == self.at_most else math.ceil
        return format(cut(self.value * scale) / scale, f".{most}f")

    def _met_by(self, value: float) -> bool:
        assert self.target is not None
        return value <= self.target if self.at_most else value >= self.target


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


def ms(seconds: float) -> str:
    """Milliseconds, to 0.1 ms below 10 ms."""
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def rounds_range(seconds: Sequence[float], jobs: int) -> str:
    """``; range slowest..fastest/s`` over rounds of ``jobs`` each; nothing for one round."""
    if len(seconds) < 2:
        return ""
    return f"; range {jobs / max(seconds):,.0f}..{jobs / min(seconds):,.0f}/s"
