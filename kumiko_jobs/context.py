"""The job context ``ctx`` handed to every handler."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import DeferralError, EscapeHatchDenied
from kumiko_jobs.scrubbing import scrub
from kumiko_jobs.validation import MAX_DELAY_SECONDS, storable_text

if TYPE_CHECKING:
    from kumiko_jobs.definitions import JobDefinition
    from kumiko_jobs.dispatching import DispatchResult

process_logger = logging.getLogger("kumiko_jobs.jobs")
logger = logging.getLogger("kumiko_jobs")

# A run record keeps at most this many ctx.log lines an attempt, each cut to this many
# characters: a handler that logs in a tight loop, or logs a whole response body, must not turn
# its run's row into megabytes that each retry reads back and each console page loads.
MAX_LOG_LINES = 1000
MAX_LOG_LINE_CHARS = 10_000


@dataclass(frozen=True)
class Deferral:
    """Returned by ``ctx.defer()``; the handler must return it for the run to be deferred."""

    delay_ms: int


class _Kept:
    """How many lines over MAX_LOG_LINES an attempt's loggers did not keep."""

    __slots__ = ("dropped", "lock")

    def __init__(self) -> None:
        self.dropped = 0
        # A handler may log from threads of its own.
        self.lock = threading.Lock()


# What ``exc_info=`` takes, as in the standard library's logging.
ExcInfo = bool | BaseException | tuple[Any, Any, Any] | None
# The record's level names, by the standard library's numbers (a level between two takes the
# lower name: 35 is a warning).
_LEVEL_NAMES = ((logging.CRITICAL, "critical"), (logging.ERROR, "error"), (logging.WARNING, "warning"))


class JobLogger:
    """``ctx.log``: lines (info and above) land on the run record, scrubbed (``SCRUBBER``); with
    ``KUMIKO_JOBS["LOG_JOB_LINES"]`` they are copied to the ``kumiko_jobs.jobs`` logger too.

    Its methods are the standard logger's (``debug`` to ``critical``, ``exception``, ``log``,
    ``exc_info=``), so code written against ``logging.Logger`` works unchanged; a traceback
    asked for with ``exc_info`` is kept on the line, scrubbed like the message. An attempt keeps
    ``MAX_LOG_LINES`` lines of at most ``MAX_LOG_LINE_CHARS`` characters; a last line counts the
    ones over that."""

    def __init__(
        self,
        job_name: str,
        attempt: int,
        extra: Mapping[str, Any] | None = None,
        *,
        to_process_log: bool | None = None,
    ) -> None:
        self.lines: list[dict[str, Any]] = []
        self._kept = _Kept()  # shared with child loggers, as the lines are
        self._job_name = job_name
        self._attempt = attempt
        self._extra = dict(extra or {})
        self._to_process_log = (
            bool(get_config()["LOG_JOB_LINES"]) if to_process_log is None else to_process_log
        )

    def _add(
        self,
        level: str,
        message: str,
        args: tuple[Any, ...],
        exc_info: ExcInfo,
        extra: Mapping[str, Any] | None = None,
        stack_info: bool = False,
    ) -> None:
        text = _format(message, args)
        fields = {**self._extra, **extra} if extra else self._extra
        if fields:
            text = f"{text} {fields}"
        if stack_info:
            text = f"{text}\nStack (most recent call last):\n{''.join(traceback.format_stack()[:-2])}"
        tb = _traceback_text(exc_info)
        if tb:
            text = f"{text}\n{tb}"
        # Cut after scrubbing: a cut through a secret could leave the scrubber half of it.
        text = cut_line(scrub(text))
        now = datetime.now(UTC).isoformat()
        with self._kept.lock:
            if len(self.lines) < MAX_LOG_LINES:
                self.lines.append({"t": now, "level": level, "msg": text, "attempt": self._attempt})
            else:
                self._not_kept(now)
                return
        if self._to_process_log:
            process_logger.log(getattr(logging, level.upper()), "[%s] %s", self._job_name, text)

    def _not_kept(self, now: str) -> None:
        """(Under the lock.) One more line over MAX_LOG_LINES: the record's last line counts
        them, and the process log says so once an attempt."""
        self._kept.dropped += 1
        msg = (
            f"{self._kept.dropped} more ctx.log line(s) not kept: a run record keeps "
            f"{MAX_LOG_LINES} lines an attempt"
        )
        line = {"t": now, "level": "warning", "msg": msg, "attempt": self._attempt}
        if self._kept.dropped == 1:
            self.lines.append(line)
            logger.warning(
                "kumiko_jobs: job %s (attempt %d) logged more than %d lines; its run record keeps "
                "the first %d and counts the rest",
                self._job_name,
                self._attempt,
                MAX_LOG_LINES,
                MAX_LOG_LINES,
            )
        else:
            self.lines[-1] = line

    def debug(self, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        # Debug lines never reach the run record; the process log gets them with LOG_JOB_LINES.
        _options(kw)
        if self._to_process_log and process_logger.isEnabledFor(logging.DEBUG):
            text = _format(message, args)
            tb = _traceback_text(exc_info)
            process_logger.debug("[%s] %s", self._job_name, scrub(f"{text}\n{tb}" if tb else text))

    def info(self, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        self._add("info", message, args, exc_info, *_options(kw))

    def warning(self, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        self._add("warning", message, args, exc_info, *_options(kw))

    warn = warning

    def error(self, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        self._add("error", message, args, exc_info, *_options(kw))

    def exception(self, message: str, *args: Any, exc_info: ExcInfo = True, **kw: Any) -> None:
        """An error line with the traceback of the exception being handled."""
        self._add("error", message, args, exc_info, *_options(kw))

    def critical(self, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        self._add("critical", message, args, exc_info, *_options(kw))

    fatal = critical

    def log(self, level: int, message: str, *args: Any, exc_info: ExcInfo = None, **kw: Any) -> None:
        """A line at a standard logging level (``logging.INFO`` ...)."""
        if not isinstance(level, int) or isinstance(level, bool):
            raise TypeError(f"level must be an int such as logging.INFO, not {level!r}")
        if level < logging.INFO:
            self.debug(message, *args, exc_info=exc_info, **kw)
            return
        name = next((name for floor, name in _LEVEL_NAMES if level >= floor), "info")
        self._add(name, message, args, exc_info, *_options(kw))

    def child(self, **extra: Any) -> JobLogger:
        """A logger whose lines carry ``extra``; lines land on the same run."""
        child = JobLogger(
            self._job_name, self._attempt, {**self._extra, **extra}, to_process_log=self._to_process_log
        )
        child.lines, child._kept = self.lines, self._kept
        return child


@dataclass
class JobContext:
    """``ctx``, the second argument of every handler: who and what the run is for, its logger
    (lines land on the run record), chaining (``dispatch``), ``defer`` and the audited escape
    hatches. The tenant is already active (``TENANT_ACTIVATOR``) when the handler runs."""

    job_name: str
    run_id: str
    job_id: str
    tenant_id: str | None
    attempt: int
    final_attempt: bool
    triggered_by: str | None
    trigger_name: str
    correlation_id: str
    lane: str
    definition: JobDefinition = field(repr=False)
    log: JobLogger = field(repr=False)
    inline: bool = False
    # The tick's time (aware UTC) for runs of a cron schedule; None for every other run.
    scheduled_at: datetime | None = None
    # The worker running this attempt ('' inline).
    worker: str = ""
    # Escape-hatch uses by kind, written by audit.flush_audits() when the handler is done.
    audit_uses: dict[str, int] = field(default_factory=dict, repr=False)

    def dispatch(self, name: str, payload: Mapping[str, Any] | None = None, **options: Any) -> DispatchResult:
        """Chain a job: same tenant and correlation id unless given.

        Works in ``async def`` handlers too: there the dispatch runs in a helper thread (Django
        allows no database work inside a running event loop) and the loop waits for it; ``await
        ctx.adispatch(...)`` lets the loop go on meanwhile."""
        from kumiko_jobs.async_handlers import call_off_loop, in_event_loop
        from kumiko_jobs.dispatching import dispatch

        options.setdefault("tenant", self.tenant_id)
        options.setdefault("correlation_id", self.correlation_id)
        if in_event_loop():
            return call_off_loop(dispatch, name, payload, **options)
        return dispatch(name, payload, **options)

    async def adispatch(
        self, name: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> DispatchResult:
        """``ctx.dispatch`` for ``async def`` handlers, without blocking the event loop."""
        from asgiref.sync import sync_to_async

        result: DispatchResult = await sync_to_async(self.dispatch, thread_sensitive=True)(
            name, payload, **options
        )
        return result

    def defer(self, delay_ms: int) -> Deferral:
        """``return ctx.defer(ms)``: run again after ``delay_ms``, same attempt (max ``max_defers``)."""
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms <= 0:
            raise ValueError(
                f"Job {self.job_name!r}: ctx.defer needs a positive integer delay in ms (got {delay_ms!r})"
            )
        if delay_ms > MAX_DELAY_SECONDS * 1000:
            # A unit mistake (seconds as microseconds) overflowed the datetime after the handler
            # returned, outside its error handling: the worker died, and the next one too.
            raise ValueError(
                f"Job {self.job_name!r}: ctx.defer({delay_ms}) is over a year; the delay is in ms."
            )
        if self.inline:
            raise DeferralError(
                f"Job {self.job_name!r}: ctx.defer needs a queued run; "
                "it is not available inline (boot gate)."
            )
        return Deferral(delay_ms)

    def _require_grant(self, grant: str, what: str) -> None:
        if not self.definition.grants(grant):
            raise EscapeHatchDenied(
                f"Job {self.job_name!r} used {what} without a grant. Declare "
                f'@job(escape_hatch=EscapeHatch("<why>", grants=("{grant}",))) or system_scope=True.'
            )

    @contextmanager
    def unscoped(self) -> Iterator[None]:
        """Global reads (django-scopes disabled). Needs the ``unscoped`` grant; writes in the
        block need ``global_writes`` too (without it they raise EscapeHatchDenied)."""
        self._require_grant("unscoped", "ctx.unscoped()")
        from kumiko_jobs.escape_hatches import unscoped

        with unscoped(self, writes=self.definition.grants("global_writes")):
            yield

    @contextmanager
    def cross_tenant_reads(self) -> Iterator[None]:
        """Reads across tenants; writes are refused. Needs the ``unscoped`` grant."""
        self._require_grant("unscoped", "ctx.cross_tenant_reads()")
        from kumiko_jobs.escape_hatches import cross_tenant_reads

        with cross_tenant_reads(self):
            yield

    @contextmanager
    def as_user(self, user: Any) -> Iterator[None]:
        """Act as ``user`` for writes made through the job. Needs the ``system_identity`` grant."""
        self._require_grant("system_identity", "ctx.as_user()")
        from kumiko_jobs.escape_hatches import as_user

        with as_user(self, user):
            yield


def _traceback_text(exc_info: ExcInfo) -> str:
    """The traceback ``exc_info`` asks for, as logging would format it ('' for none)."""
    if not exc_info:
        return ""
    if isinstance(exc_info, BaseException):
        exc: BaseException | None = exc_info
    elif isinstance(exc_info, tuple):
        exc = exc_info[1]
    else:
        exc = sys.exc_info()[1]
    if exc is None:
        return ""
    return "".join(traceback.format_exception(exc)).rstrip("\n")


def cut_line(text: str) -> str:
    """A run record's log line, storable (validation.storable_text) and at most
    MAX_LOG_LINE_CHARS long, saying how much was cut."""
    text = storable_text(text)
    if len(text) <= MAX_LOG_LINE_CHARS:
        return text
    return f"{text[:MAX_LOG_LINE_CHARS]}... [{len(text) - MAX_LOG_LINE_CHARS} more characters not kept]"


def _format(message: Any, args: tuple[Any, ...]) -> str:
    """A line's text as ``logging`` makes it (``LogRecord.getMessage``): one mapping argument
    fills ``%(name)s``. Arguments that do not fit the format are kept beside it, as the standard
    logger reports them and goes on: a log call must not fail the job."""
    text = str(message)
    if not args:
        return text
    values: Any = args[0] if len(args) == 1 and isinstance(args[0], Mapping) and args[0] else args
    try:
        return str(text % values)
    except (TypeError, ValueError, KeyError) as exc:
        return f"{text} {args!r} (the arguments do not fit the format: {type(exc).__name__})"


def _options(kw: dict[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
    """The standard logger's keyword arguments: ``extra`` (added to the line, as ``child()``'s
    fields are), ``stack_info``, ``stacklevel`` (no meaning here). Others are a TypeError, as
    they are for ``logging``."""
    unknown = set(kw) - {"extra", "stack_info", "stacklevel"}
    if unknown:
        raise TypeError(f"ctx.log got unexpected keyword argument(s) {sorted(unknown)}")
    extra = kw.get("extra")
    return (extra if isinstance(extra, Mapping) else None), bool(kw.get("stack_info"))
