"""``jobs rebuild [--dry-run]``: check every unfinished run of this deployment against Redis now
and push the ones Redis does not hold from their records (after a Redis restart without
persistence, a failover, or keys deleted by hand). Workers do the same by themselves when
Redis lost its data; this is for operators who want it done, and reported, now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from kumiko_jobs.cli.base import Output, Subcommand
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.rebuild import rebuild_lane


class Rebuild(Subcommand):
    name = "rebuild"
    help = "Push unfinished runs Redis lost again from their records (--dry-run: only count them)."
    json_option = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Report what is missing, push nothing.")

    def run(self, options: dict[str, Any], out: Output) -> None:
        reports = [rebuild_lane(get_redis(), get_keys(), lane, dry_run=options["dry_run"]) for lane in LANES]
        data = {r.lane: {"checked": r.checked, "missing": r.missing, "pushed": r.pushed} for r in reports}
        if out.as_json:
            out.json(data)
            return
        rows = [[lane, str(v["checked"]), str(v["missing"]), str(v["pushed"])] for lane, v in data.items()]
        title = "Unfinished runs checked against Redis" + (" (dry run)" if options["dry_run"] else "")
        out.table(title, ["lane", "checked", "missing from Redis", "pushed again"], rows)
