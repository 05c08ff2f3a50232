"""Scrubbing (scrubbing.py): error text, tracebacks and job log lines lose e-mail addresses,
bearer tokens, URL passwords and card numbers before they are stored or logged."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun
from kumiko_jobs.scrubbing import scrub, scrub_text
from kumiko_jobs.testing import drain

SECRETS = ("ann@example.com", "eyJhbGciOiJIUzI1NiJ9", "hunter2", "4111 1111 1111 1111", "5555-5555-5555-4444")


def upper(text: str) -> str:
    return text.upper()


def broken(text: str) -> str:
    raise RuntimeError(text)  # would leak the text if its message were logged


@pytest.mark.parametrize(
    ("raw", "scrubbed"),
    [
        ("mail ann.lee+jobs@mail.example.co.uk now", "mail [email] now"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Authorization: Bearer [redacted]"),
        ("bearer abcdefgh12345678", "bearer [redacted]"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [redacted]"),
        ("redis://:s3cret@cache:6379/0", "redis://:[redacted]@cache:6379/0"),
        ("postgres://app:hunter2@db.internal/prod", "postgres://app:[redacted]@db.internal/prod"),
        ("GET /cb?code=1&access_token=abc.def&x=1", "GET /cb?code=1&access_token=[redacted]&x=1"),
        ("password='p4ss word' retry", "password=[redacted] retry"),
        ("body {'password': 'hunter2', 'user': 'ann'}", "body {'password': [redacted], 'user': 'ann'}"),
        ('{"api_key": "abc123", "ok": false}', '{"api_key": [redacted], "ok": false}'),
        ("card 4111111111111111.", "card [card]."),
        ("card 4111 1111 1111 1111 declined", "card [card] declined"),
        ("card 5555-5555-5555-4444", "card [card]"),
        ("amex 378282246310005", "amex [card]"),
    ],
)
def test_default_scrubber_removes_personal_data_and_secrets(raw: str, scrubbed: str) -> None:
    assert scrub_text(raw) == scrubbed


@pytest.mark.parametrize(
    "kept",
    [
        "job id 1734567890124 took 12 ms",  # a 13-digit number that is no card (Luhn fails)
        "4111 1111 1111 1112",  # card-shaped, wrong check digit
        "run 4f1c2a7e-1b2c-4d3e-8f90-123456789012 failed",
        # Digits between a UUID's letters that pass the Luhn check (a run id in a log line).
        "Task id=01a2470c-f111-7337-9847-75845f5f7318 state=FAILED",
        "job t1-01a2470c1111733798477584513f7318 ran",
        "Basic authentication failed for the partner API",
        "the bearer of bad news",
        "ValueError: invalid literal for int() with base 10: 'x'",
        "https://example.com/path?page=2",
    ],
)
def test_default_scrubber_keeps_ordinary_text(kept: str) -> None:
    assert scrub_text(kept) == kept


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_stores_and_logs_only_scrubbed_text(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kumiko_jobs")
    result = dispatch("tests.raise_secret", {})
    assert drain() == {"failed": 1}
    run = JobRun.objects.get(pk=result.run_id)
    stored = [run.error, run.traceback, *(line["msg"] for line in run.logs)]
    exc_info = zlib.decompress(redis_client.hget(get_keys().job(result.job_id), "exc_info")).decode()
    for text in [*stored, exc_info, caplog.text]:
        for secret in SECRETS:
            assert secret not in text
    assert run.error.startswith("ValueError: mail [email], header Authorization: Bearer [redacted]")
    assert "postgres://app:[redacted]@db.internal" in run.traceback and "card [card]" in run.traceback
    assert [line["msg"] for line in run.logs[:2]] == [
        "working for [email]",
        "retrying with card [card] {'token': [redacted]}",
    ]
    # The per-attempt line is there (scrubbed); job lines stay off the process log by default.
    assert any("error=ValueError: mail [email]" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.name == "kumiko_jobs.jobs"]


@pytest.mark.django_db(transaction=True)
def test_log_job_lines_copies_them_scrubbed_to_the_process_log(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "LOG_JOB_LINES": True}
    caplog.set_level(logging.INFO, logger="kumiko_jobs.jobs")
    dispatch("tests.raise_secret", {})
    drain()
    lines = [r.getMessage() for r in caplog.records if r.name == "kumiko_jobs.jobs"]
    assert lines == [
        "[tests.raise_secret] working for [email]",
        "[tests.raise_secret] retrying with card [card] {'token': [redacted]}",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_scrubber_setting_is_used(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCRUBBER": "tests.test_scrubbing.upper"}
    result = dispatch("tests.raise_secret", {})
    drain()
    assert JobRun.objects.get(pk=result.run_id).error.startswith("VALUEERROR: MAIL ANN@EXAMPLE.COM")


@pytest.mark.django_db(transaction=True)
def test_no_scrubber_stores_text_as_it_is(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCRUBBER": None}
    result = dispatch("tests.raise_secret", {})
    drain()
    assert "ann@example.com" in JobRun.objects.get(pk=result.run_id).error


def test_a_failing_scrubber_withholds_the_text(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCRUBBER": "tests.test_scrubbing.broken"}
    assert scrub("mail ann@example.com") == "[withheld: the SCRUBBER raised RuntimeError]"
    assert "ann@example.com" not in caplog.text


def test_tracebacks_logged_by_the_package_are_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ConnectionError("could not reach redis://:hunter2@cache:6379 for ann@example.com")
    except ConnectionError:
        logging.getLogger("kumiko_jobs").exception("kumiko_jobs: write failed for %s", "bob@example.com")
    assert "hunter2" not in caplog.text and "example.com" not in caplog.text
    assert "redis://:[redacted]@cache:6379 for [email]" in caplog.text
    assert "write failed for [email]" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_failed_django_tasks_logged_traceback_is_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    from tests.testapp import tasks

    caplog.set_level(logging.DEBUG, logger="django.tasks")
    result = tasks.raise_secret.enqueue()
    assert drain() == {"failed": 1}
    failed = [r for r in caplog.records if r.name == "django.tasks" and result.id in r.getMessage()]
    assert [r.levelname for r in failed][-1] == "ERROR"
    assert "mail [email]" in caplog.text and "postgres://app:[redacted]@db.internal" in caplog.text
    for secret in SECRETS[:4]:
        assert secret not in caplog.text
