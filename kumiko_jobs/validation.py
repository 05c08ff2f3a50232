"""Checking what ``dispatch()`` and ``emit()`` are given, before anything is written.

A run that Redis accepts but its record cannot store (a NUL character PostgreSQL's jsonb
refuses, a lone surrogate UTF-8 cannot encode, a correlation id longer than its column) would
run without a record; such input is refused here with an error that names it.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

from kumiko_jobs.exceptions import InvalidDispatch, InvalidPayload

# Nesting beyond this is refused (without recursion, so no RecursionError either).
MAX_DEPTH = 64
# Integers must fit in a signed 64-bit column or a JavaScript-free JSON reader; larger numbers
# travel as strings.
INT_RANGE = 2**63
# A delay longer than a year is almost certainly a unit mistake (milliseconds for seconds).
MAX_DELAY_SECONDS = 366 * 24 * 3600
# Column widths of JobRun (models.py).
MAX_CORRELATION_ID = 64
MAX_USER_ID = 64
MAX_TRIGGER_NAME = 200
# What an incoming X-Request-ID may be to become a correlation id (CorrelationMiddleware): it
# fits the column, and is safe to show in the admin, in log lines and in a URL's query string.
CORRELATION_ID_RE = re.compile(rf"[A-Za-z0-9._:/+=-]{{1,{MAX_CORRELATION_ID}}}")

Node = tuple[Any, str, int]  # value, key path, depth


def validate_payload(payload: Any) -> dict[str, Any]:
    """Check that ``payload`` is a JSON object a run record can store; raise InvalidPayload
    naming the key path of the first problem."""
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise InvalidPayload("$", f"expected a dict, got {type(payload).__name__}")
    stack: list[Node] = [(payload, "$", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
        elif value is None or isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not -INT_RANGE <= value < INT_RANGE:
                raise InvalidPayload(path, "integers must fit in 64 bits; send larger numbers as strings")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidPayload(path, f"{value!r} is not representable in JSON")
        elif isinstance(value, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise InvalidPayload(path, f"nested deeper than {MAX_DEPTH} levels")
            stack.extend(_children(value, path, depth + 1))
        else:
            raise InvalidPayload(path, f"{type(value).__name__} is not JSON-serialisable")
    return payload


def _children(
    value: dict[Any, Any] | list[Any] | tuple[Any, ...], path: str, depth: int
) -> list[tuple[Any, str, int]]:
    if isinstance(value, dict):
        children = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"{path}.{key!r}", f"keys must be str, got {type(key).__name__}")
            _check_text(key, f"{path}.{key!r} (key)")
            children.append((item, f"{path}.{key}", depth))
        return children
    return [(item, f"{path}[{index}]", depth) for index, item in enumerate(value)]


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidPayload(path, "strings must not contain NUL characters (\\x00)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPayload(path, f"the string is not valid Unicode ({exc.reason} at {exc.start})") from None


def storable_text(text: str) -> str:
    """Text a run record can hold, whatever a handler produced: PostgreSQL's text and jsonb
    refuse NUL, and UTF-8 cannot encode a lone surrogate. An exception's message or a log line
    may carry either; such a run's outcome write failed, so its record never said it ran, and
    repair ran it again, and again. (A payload with them is refused instead: validate_payload.)"""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def check_text_option(name: str, value: Any, max_length: int) -> str:
    """A text argument stored on the run (correlation id, trigger name, user id)."""
    if not isinstance(value, str):
        raise InvalidDispatch(f"{name} must be a str, got {type(value).__name__}.")
    if len(value) > max_length:
        raise InvalidDispatch(
            f"{name} {value[:20]!r}... is {len(value)} characters; at most {max_length} fit."
        )
    if not value.isprintable():  # control characters, NUL, lone surrogates
        raise InvalidDispatch(f"{name} {value[:20]!r} contains unprintable characters.")
    return value


def is_correlation_id(value: str) -> bool:
    """True if ``value`` may be taken as a correlation id from outside (a request header)."""
    return CORRELATION_ID_RE.fullmatch(value) is not None


def delay_seconds(delay: timedelta | float | None) -> float:
    """A dispatch's delay in seconds: finite, at most MAX_DELAY_SECONDS; negative means now."""
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise InvalidDispatch(
            f"delay must be a timedelta or seconds (int/float), got {type(delay).__name__}."
        )
    if not math.isfinite(seconds):
        raise InvalidDispatch(f"delay={delay!r} is not a finite number of seconds.")
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidDispatch(
            f"delay={delay!r} is over a year ({MAX_DELAY_SECONDS} s); pass seconds or a timedelta, not ms."
        )
    return max(seconds, 0.0)
