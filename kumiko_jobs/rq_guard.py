"""Keep RQ's own started-registry cleanup away from kumiko lanes.

RQ counts a started registry by cleaning it first (``len(StartedJobRegistry(...))`` calls
``cleanup()``), and cleanup fails every run whose lease expired. django-rq's dashboard,
``rqstats`` and its Prometheus collector count registries on every request, so a dead worker's
run would be failed there, behind kumiko's reaper: no retry, no run record, and its limits and
cap slot never released. A lane's started registry belongs to kumiko's reaper
(``maintenance.reap``), so the cleanup skips lane queues of this project's prefix and runs as
before for every other queue. RQ tools outside Django (``rq info``) do not load this: point
them at other queues only.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from rq.registry import StartedJobRegistry

from kumiko_jobs.connection import get_keys

_MARK = "_kumiko_skips_lanes"


def install() -> None:
    """Wrap StartedJobRegistry.cleanup once per process (AppConfig.ready())."""
    original = StartedJobRegistry.cleanup
    if getattr(original, _MARK, False):
        return

    @wraps(original)
    def cleanup(self: StartedJobRegistry, *args: Any, **kwargs: Any) -> Any:
        if get_keys().lane_of_queue(self.name) is not None:
            return None
        return original(self, *args, **kwargs)

    setattr(cleanup, _MARK, True)
    StartedJobRegistry.cleanup = cleanup  # type: ignore[method-assign]
