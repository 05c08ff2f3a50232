"""``manage.py jobs list|trigger|stats|rebuild|prune``: operator commands (kumiko_jobs/cli, one
module each)."""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from kumiko_jobs.cli import SUBCOMMANDS
from kumiko_jobs.cli.base import Output
from kumiko_jobs.conf import redis_description
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.pushing import REDIS_FAILURES, redis_hint


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
        # Every subcommand's Redis failure ends here as one line, not a traceback: no answer or a
        # refusal (pushing.REDIS_FAILURES), and the QueueUnavailable dispatch makes of them.
        except (QueueUnavailable, *REDIS_FAILURES) as exc:
            raise CommandError(f"jobs {subcommand.name}: {redis_failure(exc)}") from exc


def redis_failure(exc: Exception) -> str:
    """One line: where (the URL without its password), what Redis said, what to do."""
    if isinstance(exc, QueueUnavailable):
        return str(exc)  # a push's: it names Redis, and a refusal's own hint (pushing.unavailable)
    where = f"Redis at {redis_description()}"
    said = " ".join(str(exc).split())  # a script error's text spans lines
    hint = redis_hint(exc)  # the push's own (pushing.unavailable)
    if isinstance(exc, redis.AuthenticationError):
        return f"{where} refused the credentials ({said}).{hint}"
    if isinstance(exc, redis.ResponseError) and hint:
        return f"{where} refused a command ({said}).{hint}"
    if isinstance(exc, redis.ResponseError):
        return f"{where} answered with an error ({said})."
    return (
        f"{where} did not answer ({said}). Check that Redis runs and that KUMIKO_JOBS['REDIS'] "
        "(or env KUMIKO_REDIS_URL) points at it."
    )
