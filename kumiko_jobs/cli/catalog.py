"""``jobs list``: every declared job, its triggers, its next fire time and its last success."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from kumiko_jobs.catalog import JobInfo, NextFire, job_catalog, last_success, next_fire, zones_in_use
from kumiko_jobs.cli.base import Output, Subcommand
from kumiko_jobs.scheduling.specs import trigger_labels

# The catalog itself lives in kumiko_jobs.catalog (the admin console shows it too).
__all__ = ["JobInfo", "ListJobs", "NextFire", "job_catalog", "last_success", "next_fire", "zones_in_use"]


class ListJobs(Subcommand):
    name = "list"
    help = "List every declared job: lane, triggers, next fire time (UTC and its zone), last success."
    json_option = True

    def add_arguments(self, parser: CommandParser) -> None:
        pass

    def run(self, options: dict[str, Any], out: Output) -> None:
        infos = job_catalog()
        if out.as_json:
            out.json([info.as_json() for info in infos])
            return
        rows = []
        for info in infos:
            d, fire = info.definition, info.next_fire
            boot = "gate" if d.boot_gate else ("boot" if d.run_on_boot else "")
            rows.append(
                (
                    d.name,
                    d.lane,
                    "\n".join(label for t in d.triggers for label in trigger_labels(t)),
                    f"{fire.utc:%Y-%m-%d %H:%M:%S} UTC" if fire else "-",
                    f"{fire.local:%Y-%m-%d %H:%M:%S %Z} ({fire.zone})" if fire else "-",
                    f"{info.last_success_at:%Y-%m-%d %H:%M:%S %Z}" if info.last_success_at else "-",
                    ", ".join(filter(None, [boot, "per tenant" if d.per_tenant else ""])),
                )
            )
        out.table(
            f"{len(infos)} jobs",
            ("job", "lane", "triggers", "next fire (UTC)", "next fire (its zone)", "last success", "notes"),
            rows,
        )
