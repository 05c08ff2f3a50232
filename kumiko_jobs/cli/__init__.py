"""``manage.py jobs <subcommand>``: operator commands, one module per subcommand.

A subcommand is a class with ``name``, ``help``, ``add_arguments(parser)`` and
``run(options, out)``; adding one is a module and a line in SUBCOMMANDS.
"""

from __future__ import annotations

from kumiko_jobs.cli.base import Subcommand
from kumiko_jobs.cli.catalog import ListJobs
from kumiko_jobs.cli.prune import Prune
from kumiko_jobs.cli.rebuild import Rebuild
from kumiko_jobs.cli.stats import Stats
from kumiko_jobs.cli.trigger import Trigger

SUBCOMMANDS: tuple[type[Subcommand], ...] = (ListJobs, Trigger, Stats, Rebuild, Prune)

__all__ = ["SUBCOMMANDS", "Subcommand"]
