"""The names ``import kumiko_jobs`` offers: each one resolves, the exceptions a caller or a
handler may catch are among them, and the import works before Django is set up."""

from __future__ import annotations

import inspect
import subprocess
import sys

import kumiko_jobs
from kumiko_jobs import exceptions

# Raised and caught inside kumiko_jobs, by internal helpers (retrying.retry_run), or named only
# by path (a Django task result's error): kumiko_jobs.exceptions has them, the top level not.
INTERNAL = {"MalformedJob", "BootGateFailed", "NotRetryable", "TaskNotRun", "StaleAttempt"}


def test_every_name_in_all_resolves() -> None:
    for name in kumiko_jobs.__all__:
        assert getattr(kumiko_jobs, name) is not None, name


def test_the_exceptions_callers_and_handlers_catch_are_at_the_top_level() -> None:
    public = {
        name
        for name, value in vars(exceptions).items()
        if inspect.isclass(value) and issubclass(value, Exception) and name not in INTERNAL
    }
    assert {"DeferralError", "InvalidDispatch", "JobTimeout", "KumikoJobsError", "UnknownEvent"} <= public
    assert public <= set(kumiko_jobs.__all__)
    for name in public:
        assert getattr(kumiko_jobs, name) is getattr(exceptions, name)


def test_import_needs_no_django_setup() -> None:
    # settings.py and the app registry import kumiko_jobs before apps are ready.
    code = "import kumiko_jobs; print(kumiko_jobs.DeferralError.__name__, kumiko_jobs.job.__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert out.stdout.split() == ["DeferralError", "job"]
