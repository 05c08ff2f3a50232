"""``manage.py jobs <subcommand>``: operator commands, one module per subcommand.

A subcommand is a class with ``name``, ``help``, ``add_arguments(parser)`` and
``run(options, out)``; adding one is a module and a line in SUBCOMMANDS.
"""

from __future__ import annotations

from kumiko_jobs.cli.base import Subcommand
from kumiko_jobs.cli.prune import Prune

SUBCOMMANDS: tuple[type[Subcommand], ...] = (Prune,)

__all__ = ["SUBCOMMANDS", "Subcommand"]
