"""Readable ``runjobs`` output under Django's default logging, without overriding a project's own.

Django's default LOGGING configures only the ``django`` logger, so a worker's INFO lines (its
banner, one line per finished attempt) would go nowhere. Unless the project's LOGGING already
gives ``kumiko_jobs`` somewhere to write (a handler on it or an ancestor, the root included),
runjobs adds a timestamped stderr handler. ``-v 0`` shows warnings and errors only, ``-v 1``
(the default) adds the banner and per-run lines, ``-v 2`` debug lines, ``-v 3`` RQ's own. A
project that configures ``kumiko_jobs`` keeps its levels at ``-v 1``.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LEVELS = {0: logging.WARNING, 1: logging.INFO}


def configure(verbosity: int) -> None:
    kumiko = logging.getLogger("kumiko_jobs")
    level = _LEVELS.get(verbosity, logging.DEBUG)
    if kumiko.hasHandlers():
        if verbosity != 1:  # an explicit -v beats the configured level
            kumiko.setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    for name in ("kumiko_jobs", *(("rq.worker",) if verbosity >= 3 else ())):
        target = logging.getLogger(name)
        target.addHandler(handler)
        target.setLevel(level)
        target.propagate = False
