"""Every exception kumiko_jobs raises on purpose. Each message says what to do."""

from __future__ import annotations

from collections.abc import Sequence


class KumikoJobsError(Exception):
    """Base class of every kumiko_jobs error."""


class UnknownJob(KumikoJobsError, LookupError):
    """No job is registered under this name."""

    def __init__(self, name: str, close_matches: list[str]) -> None:
        self.name = name
        self.close_matches = close_matches
        hint = f" Did you mean: {', '.join(close_matches)}?" if close_matches else ""
        super().__init__(
            f"Unknown job {name!r}.{hint} Jobs are declared with @job in an installed app's jobs module."
        )


class UnknownEvent(KumikoJobsError, ValueError):
    """An event name emit() refuses: empty, or not in ``KUMIKO_JOBS["EVENTS"]``."""

    def __init__(self, message: str, close_matches: Sequence[str] = ()) -> None:
        self.close_matches = list(close_matches)
        super().__init__(message)


class InvalidPayload(KumikoJobsError, ValueError):
    """The payload is not a JSON object; ``path`` names the offending key."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"Invalid job payload at {path}: {problem}. Payloads must be JSON objects of str keys and "
            "str/int/float/bool/None/list/dict values; pass ids instead of model instances or datetimes."
        )


class InvalidDispatch(KumikoJobsError, ValueError):
    """An argument of dispatch() other than the payload or tenant is invalid (too long, not
    printable, a delay that is not finite or over a year)."""


class InvalidTenant(KumikoJobsError, ValueError):
    """The tenant passed to dispatch() does not exist or has the wrong type."""


class QueueUnavailable(KumikoJobsError, ConnectionError):
    """Redis did not answer in time; nothing was enqueued or recorded."""


class NotRetryable(KumikoJobsError, ValueError):
    """Only failed runs can be retried by hand."""


class UnrecoverableError(KumikoJobsError):
    """Raise from a handler to fail the run at once, without further retries."""


class EscapeHatchDenied(KumikoJobsError, PermissionError):
    """A job used an escape hatch its declaration does not grant."""


class DeferralError(KumikoJobsError, RuntimeError):
    """ctx.defer() was used where no queued run exists (for example in a boot gate)."""


class JobTimeout(KumikoJobsError):
    """The handler ran longer than the job's ``timeout``."""


class MalformedJob(KumikoJobsError, ValueError):
    """Data popped from a queue could not be decoded into a kumiko job."""


class BootGateFailed(KumikoJobsError):
    """A boot gate raised or ran past its timeout; runjobs does not start consuming."""

    def __init__(self, job_name: str, reason: str) -> None:
        self.job_name = job_name
        self.reason = reason
        super().__init__(f"boot gate {job_name} failed: {reason}")


class TaskNotRun(KumikoJobsError):
    """A Django task's run ended without an attempt of its own (it never reached Redis, was
    refused at commit, or its job vanished); the run's error says which."""


class StaleAttempt(KumikoJobsError):
    """An attempt's record write found the run moved on: finished, or at a later attempt (its
    worker stalled past its lease and the reaper retried it). Nothing was written; the worker
    leaves the run to whoever holds it now (attempt_records.py)."""

    def __init__(self, run_id: str, attempt: int, status: str) -> None:
        self.run_id, self.attempt, self.status = run_id, attempt, status
        super().__init__(f"run {run_id} moved on from attempt {attempt}: its record says {status}")


def text_of(exc: BaseException) -> str:
    """``str(exc)``, for an exception whose ``__str__`` raises or returns no str: described
    instead (a handler's odd exception class must not take its worker down)."""
    try:
        text = str(exc)
    except Exception as broken:
        return f"<str() of {type(exc).__name__} raised {type(broken).__name__}>"
    return text if isinstance(text, str) else f"<str() of {type(exc).__name__} gave no str>"


# Set on an exception that must end its run at once though its class is not UnrecoverableError:
# a Django task's return value that cannot be stored stays a plain TypeError, as Django's own
# backends report it, and retrying would only run the task's side effects again.
_FINAL = "_kumiko_jobs_final"


def marked_final[E: BaseException](exc: E) -> E:
    """``exc``, marked to fail its run without further retries (see ``is_final``)."""
    setattr(exc, _FINAL, True)
    return exc


def is_final(exc: BaseException) -> bool:
    """Whether ``exc`` fails its run at once: UnrecoverableError, or marked by ``marked_final``."""
    return isinstance(exc, UnrecoverableError) or getattr(exc, _FINAL, False) is True
