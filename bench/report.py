"""Show a Report as rich tables and keep it in BENCHMARKS.md, one section per database engine.

BENCHMARKS.md is partly hand-written (method, analysis); a run replaces only the block between
``<!-- bench:<engine> -->`` and ``<!-- /bench:<engine> -->``, so a SQLite run keeps the
PostgreSQL figures and the prose around them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.results import CommandCount, Figure, Rate, Ratio, Report


def _mark(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "NO")


def rate_rows(rates: list[Rate]) -> list[tuple[str, ...]]:
    return [(r.label, f"{r.jobs:,}", f"{r.per_second:,.0f}", r.spread, r.note) for r in rates]


def ratio_rows(ratios: list[Ratio]) -> list[tuple[str, ...]]:
    return [(r.label, r.shown, r.bound, _mark(r.met)) for r in ratios]


def command_rows(counts: list[CommandCount], top: int = 8) -> list[tuple[str, ...]]:
    return [
        (
            c.label,
            f"{c.jobs:,}",
            f"{c.per_job:.1f}",
            f"{c.scripts / c.jobs:.2g}",
            "" if c.target is None else f"<= {c.target:g}",
            _mark(c.met),
            c.top_text(top),
        )
        for c in counts
    ]


def figure_rows(figures: list[Figure]) -> list[tuple[str, ...]]:
    return [(f.label, f.value, f.target, _mark(f.met), f.how) for f in figures]


RATE_HEADERS = ("Throughput", "jobs", "jobs/s", "range of rounds", "how")
RATIO_HEADERS = ("Ratio", "value", "target", "met")
TENANCY_HEADERS = ("Tenancy", "value", "target", "met", "how")
SCHEDULE_HEADERS = ("Schedules", "value", "target", "met", "how")
COMMAND_HEADERS = (
    "Redis commands",
    "jobs",
    "per job",
    "script calls/job",
    "target",
    "met",
    "top commands per job",
)


CONSOLE_HEADERS = ("page", "value", "target", "met", "how")


def print_report(report: Report, console: Console) -> None:
    facts = Table(title="Machine", show_header=False)
    for name, value in report.facts.items():
        facts.add_row(name, value)
    console.print(facts)
    for title, headers, rows in _tables(report):
        table = Table(title=title)
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for note in report.notes:
        console.print(f"- {note}")


TableData = tuple[str, tuple[str, ...], list[tuple[str, ...]]]  # title, headers, rows


def _tables(report: Report, top: int = 8) -> list[TableData]:
    tables: list[TableData] = []
    if report.rates:
        tables.append(("Throughput (median round)", RATE_HEADERS, rate_rows(report.rates)))
    if report.ratios:
        tables.append(("Ratios", RATIO_HEADERS, ratio_rows(report.ratios)))
    if report.commands:
        tables.append(
            (
                "Redis commands per job (INFO commandstats)",
                COMMAND_HEADERS,
                command_rows(report.commands, top),
            )
        )
    if report.tenancy:
        tables.append(("Tenancy (one worker, one run)", TENANCY_HEADERS, figure_rows(report.tenancy)))
    if report.console:
        tables.append(("Operator console (admin pages)", CONSOLE_HEADERS, figure_rows(report.console)))
    if report.schedules:
        tables.append(("Schedules (leader, in process)", SCHEDULE_HEADERS, figure_rows(report.schedules)))
    return tables


ENGINE_TITLES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def markdown_section(report: Report, engine: str) -> str:
    lines = [
        f"### {ENGINE_TITLES.get(engine, engine)}",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `{report.command}`.",
        "",
        "| Machine | |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in report.facts.items()),
        "",
    ]
    # The page has room for the long tail of commands the terminal table cuts.
    for _, headers, rows in _tables(report, top=16):
        lines += [_md_row(headers), "|" + "---|" * len(headers), *(_md_row(row) for row in rows), ""]
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines).rstrip() + "\n"


def _md_row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def write_markdown(path: Path, engine: str, section: str) -> None:
    """Replace this engine's block in ``path`` (append it, creating the file, if absent)."""
    start, end = f"<!-- bench:{engine} -->", f"<!-- /bench:{engine} -->"
    block = f"{start}\n{section}{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
