"""``jobs trigger NAME [--tenant T] [--payload JSON]``: dispatch a job now, print its run id."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from kumiko_jobs.cli.base import Output, Subcommand
from kumiko_jobs.exceptions import InvalidPayload, InvalidTenant, UnknownJob

TRIGGER_NAME = "manual"


def parse_payload(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"--payload is not valid JSON ({exc}). "
            "Quote it for the shell: --payload '{\"invoice_id\": 42}'."
        ) from exc
    if not isinstance(payload, dict):
        raise CommandError(
            f"--payload must be a JSON object such as '{{\"key\": 1}}', got a {type(payload).__name__}."
        )
    return payload


class Trigger(Subcommand):
    name = "trigger"
    help = "Dispatch a job now (for a tenant with --tenant) and print the run id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", metavar="NAME", help="The job name, as `jobs list` shows it.")
        parser.add_argument(
            "--tenant", default=None, help="Tenant id (default: none; per_tenant jobs fan out)."
        )
        parser.add_argument("--payload", default=None, help="JSON object passed to the job (default {}).")

    def run(self, options: dict[str, Any], out: Output) -> None:
        from kumiko_jobs.dispatching import dispatch

        payload = parse_payload(options["payload"])
        try:
            result = dispatch(options["job"], payload, tenant=options["tenant"], trigger_name=TRIGGER_NAME)
        except UnknownJob as exc:
            raise CommandError(f"{exc} `manage.py jobs list` shows every job.") from exc
        except (InvalidPayload, InvalidTenant) as exc:
            raise CommandError(str(exc)) from exc
        # QueueUnavailable is reported by the command (jobs.py), as every Redis failure is.
        if result.status != "queued":
            raise CommandError(
                f"{result.job_name} was not queued: {result.status} ({result.reason}). Its concurrency "
                "or max_per_tenant gate refused it; retry once the current runs finish."
            )
        out.stdout.write(str(result.run_id))
