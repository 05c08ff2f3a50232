"""``manage.py jobs list|trigger|stats|rebuild|prune``: operator commands (kumiko_jobs/cli, one
module each)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from kumiko_jobs.cli import SUBCOMMANDS
from kumiko_jobs.cli.base import Output


class Command(BaseCommand):
    help = "Inspect and operate kumiko_jobs: " + ", ".join(s.name for s in SUBCOMMANDS) + "."

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
        for subcommand in SUBCOMMANDS:
            sub = subparsers.add_parser(subcommand.name, help=subcommand.help, description=subcommand.help)
            if subcommand.json_option:
                sub.add_argument("--json", action="store_true", help="Machine-readable JSON output.")
            subcommand().add_arguments(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = next(s for s in SUBCOMMANDS if s.name == options["subcommand"])
        try:
            subcommand().run(options, Output(self.stdout, as_json=bool(options.get("json"))))
        except DatabaseError as exc:
            raise CommandError(
                f"The database refused the query ({exc.__class__.__name__}: {exc}). "
                "Check DATABASES and run `manage.py migrate`."
            ) from exc
