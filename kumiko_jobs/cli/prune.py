"""``jobs prune [--dry-run] [--json]``: delete history older than the retention settings now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from kumiko_jobs.cli.base import Output, Subcommand
from kumiko_jobs.retention import prune


class Prune(Subcommand):
    name = "prune"
    help = (
        "Delete finished runs and tenant failure records older than RUN_RETENTION and audits older "
        "than AUDIT_RETENTION (the daily kumiko_jobs.prune_history job does the same)."
    )
    json_option = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def run(self, options: dict[str, Any], out: Output) -> None:
        report = prune(dry_run=bool(options["dry_run"]))
        if out.as_json:
            out.json(report.as_dict())
            return
        verb = "would delete" if report.dry_run else "deleted"
        out.table(
            f"Retention ({'dry run' if report.dry_run else 'pruned'})",
            ("history", "older than", verb),
            [
                ("finished runs", f"{report.run_cutoff:%Y-%m-%d %H:%M:%S %Z}", f"{report.runs:,}"),
                (
                    "tenant failure records",
                    f"{report.run_cutoff:%Y-%m-%d %H:%M:%S %Z}",
                    f"{report.tenant_failures:,}",
                ),
                ("escape-hatch audits", f"{report.audit_cutoff:%Y-%m-%d %H:%M:%S %Z}", f"{report.audits:,}"),
            ],
        )
