"""Scrubbing: personal data and secrets are removed from error text, tracebacks and job log
lines before they are stored (run records, Redis) or logged.

``KUMIKO_JOBS["SCRUBBER"]`` names a ``(text) -> text`` function; the default, ``scrub_text``,
removes e-mail addresses, bearer/basic credentials, ``password=...``-style secrets, passwords
in URLs (``scheme://user:password@host``) and card-like digit runs (13-19 digits standing
alone that pass the Luhn check, so timestamps and ids in tracebacks survive). ``None`` stores text as it is.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from kumiko_jobs.conf import import_setting

logger = logging.getLogger("kumiko_jobs")

Scrubber = Callable[[str], str]

_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/:@]*):([^\s/@]+)@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
# "Basic <base64>" only when the token has a digit or base64 punctuation ("Basic authentication
# failed" stays readable).
_BASIC = re.compile(r"\b(Basic\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
_SECRET_PARAM = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|api[_-]?key)"
    # The key may be quoted, as in a dict's repr or JSON: {'password': 'x'}, {"api_key": "x"}.
    r"([\"']?\s*[=:]\s*)(?!\[)(\"[^\"]*\"|'[^']*'|[^\s&,;]+)"
)
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# 13-19 digits, optionally grouped by single spaces or dashes, not part of a longer number or
# word: the digits between a UUID's letters ("01a2470c-f111-7337-9847-75845f5f7318") passed the
# Luhn check one time in ten, and a run id in a log line became "[card]".
_DIGIT_RUN = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")


def scrub_text(text: str) -> str:
    """The default scrubber: e-mail addresses, credentials and card numbers replaced by markers."""
    text = _URL_PASSWORD.sub(r"\1\2:[redacted]@", text)
    text = _BEARER.sub(r"\1[redacted]", text)
    text = _BASIC.sub(r"\1[redacted]", text)
    text = _SECRET_PARAM.sub(r"\1\2[redacted]", text)
    text = _EMAIL.sub("[email]", text)
    return _DIGIT_RUN.sub(_card_or_number, text)


def _card_or_number(match: re.Match[str]) -> str:
    digits = [int(c) for c in match.group() if c.isdigit()]
    return "[card]" if 13 <= len(digits) <= 19 and _luhn_valid(digits) else match.group()


def _luhn_valid(digits: list[int]) -> bool:
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


@cache
def get_scrubber() -> Scrubber | None:
    """The configured scrubber (resolved once; reset when KUMIKO_JOBS changes)."""
    scrubber: Scrubber | None = import_setting("SCRUBBER")
    return scrubber


def scrub(text: str) -> str:
    """``text`` through the configured scrubber. A scrubber that fails or returns a non-string
    never lets the raw text through: a marker is stored instead."""
    if not text:
        return text
    try:
        scrubber = get_scrubber()
        if scrubber is None:
            return text
        result = scrubber(text)
    except Exception as exc:  # an unimportable path too (system check kumiko_jobs.E401)
        logger.warning("kumiko_jobs: the SCRUBBER raised %s; the text is withheld", type(exc).__name__)
        return f"[withheld: the SCRUBBER raised {type(exc).__name__}]"
    if not isinstance(result, str):
        return f"[withheld: the SCRUBBER returned {type(result).__name__}, not str]"
    return result


class ScrubbingFilter(logging.Filter):
    """A logging filter that scrubs the message and traceback of records that carry one
    (``logger.exception``): database and Redis errors can quote the data they failed on.

    kumiko_jobs attaches it to its own loggers (``LOGGERS``); add it to a handler to cover
    other loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            try:
                message = record.getMessage()
            except Exception:  # arguments that do not fit the format: keep the format only
                message = str(record.msg)
            record.msg, record.args = scrub(message), None
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


# The package's loggers whose records may carry a traceback (a filter on a logger covers only
# records made on that very logger, not its children).
LOGGERS = (
    "kumiko_jobs",
    "kumiko_jobs.worker",
    "kumiko_jobs.audit",
    "kumiko_jobs.runs",
    "kumiko_jobs.jobs",
    "kumiko_jobs.signals",  # a receiver's traceback (an SMTP or HTTP client error quoting data)
)
# Django's tasks framework logs a failed task's traceback on its own logger (and Django's default
# LOGGING mails it to ADMINS): scrubbed too where kumiko runs the tasks.
TASK_LOGGERS = ("django.tasks",)


def install_log_filter(names: tuple[str, ...] = LOGGERS) -> None:
    """Attach one ScrubbingFilter to each of these loggers, the package's by default
    (idempotent)."""
    for name in names:
        target = logging.getLogger(name)
        if not any(isinstance(f, ScrubbingFilter) for f in target.filters):
            target.addFilter(ScrubbingFilter())


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "KUMIKO_JOBS":
        get_scrubber.cache_clear()
