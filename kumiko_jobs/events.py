"""Event names that a typo cannot swallow.

``emit()`` of an event no job listens to is legal (a listener may come with a later deploy) but
is logged as a warning once per name and process. With ``KUMIKO_JOBS["EVENTS"]`` the set of
names is closed: a trigger on an undeclared event is a system-check error (kumiko_jobs.E207)
and ``emit()`` of one raises UnknownEvent with the close matches.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from functools import cache
from typing import Any

from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import UnknownEvent

logger = logging.getLogger("kumiko_jobs")
_warned: set[str] = set()


def declared_events() -> frozenset[str] | None:
    """The names in ``KUMIKO_JOBS["EVENTS"]``, or None when any name is allowed (unset, or not
    a list of names: the system check kumiko_jobs.E206 reports that)."""
    names = get_config().get("EVENTS")
    if names is None or not is_name_list(names):
        return None
    return _as_set(tuple(names))


def is_name_list(value: Any) -> bool:
    return isinstance(value, list | tuple | set | frozenset) and all(isinstance(e, str) and e for e in value)


@cache
def _as_set(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(names)


def close_matches(event: str, names: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(event, sorted(names), n=3)


def check_emitted(event: str, *, listeners: int) -> None:
    """Refuse an undeclared event; warn (once per name) about one nobody listens to."""
    declared = declared_events()
    if declared is not None and event not in declared:
        matches = close_matches(event, declared)
        hint = f" Did you mean: {', '.join(matches)}?" if matches else ""
        raise UnknownEvent(
            f"Event {event!r} is not declared in KUMIKO_JOBS['EVENTS'].{hint} "
            "Add it to that list, or fix the name.",
            matches,
        )
    if not listeners and event not in _warned:
        _warned.add(event)
        logger.warning(
            "kumiko_jobs: emit(%r) reached no job: no on_event trigger listens to it "
            "(logged once per event name). Check the name, or declare KUMIKO_JOBS['EVENTS'].",
            event,
        )
