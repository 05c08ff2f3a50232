"""Lifecycle signals: one per transition, after the record is written, with a RunInfo and
never the payload; a receiver that raises never fails a job."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
import redis
from django.db import transaction

from kumiko_jobs import dispatch, signals
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.signals import RunInfo
from kumiko_jobs.testing import drain
from tests.testapp.signals import signals_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(redis_client: redis.Redis) -> Any:
    """What the test app's receiver recorded: [(signal, run dict, extra), ...]."""

    def read(job: str | None = None) -> list[dict[str, Any]]:
        entries = [json.loads(raw) for raw in redis_client.lrange(signals_key(), 0, -1)]
        return [e for e in entries if job is None or e["sender"] == job]

    return read


def names(entries: list[dict[str, Any]]) -> list[str]:
    return [e["signal"] + (f"(final={e['final']})" if "final" in e else "") for e in entries]


def test_a_run_that_succeeds_sends_queued_started_succeeded_once_each(tenants: list[Any], sent: Any) -> None:
    result = dispatch("tests.record", {"n": 1, "secret": "payload"}, tenant=tenants[0])
    assert names(sent()) == ["job_queued"]
    drain()
    entries = sent()
    assert names(entries) == ["job_queued", "job_started", "job_succeeded"]
    run = entries[-1]["run"]
    assert set(run) == {f.name for f in dataclasses.fields(RunInfo)}
    assert run == {
        "run_id": result.run_id, "job_id": result.job_id, "job_name": "tests.record",
        "tenant_id": str(tenants[0].pk), "attempt": 1, "final_attempt": True, "lane": "worker",
        "status": "succeeded", "error": None,
    }  # fmt: skip
    assert all(e["sender"] == "tests.record" for e in entries)
    assert "payload" not in json.dumps(entries)


def test_failed_attempts_say_whether_they_were_final_and_only_the_final_one_carries_the_error(
    tenants: list[Any], sent: Any
) -> None:
    dispatch("tests.flaky", {"succeed_on": 99}, tenant=tenants[0])
    drain()
    entries = sent()
    assert names(entries) == [
        "job_queued",
        *["job_started", "job_failed(final=False)"] * 2,
        "job_started",
        "job_failed(final=True)",
    ]
    failures = [e["run"] for e in entries if e["signal"] == "job_failed"]
    assert [(f["attempt"], f["final_attempt"], f["status"]) for f in failures] == [
        (1, False, "queued"), (2, False, "queued"), (3, True, "failed"),
    ]  # fmt: skip
    assert [f["error"] for f in failures] == [None, None, "RuntimeError: flaky failure on attempt 3"]


def test_deferrals_send_job_deferred(tenants: list[Any], sent: Any) -> None:
    dispatch("tests.defer", {"times": 1, "ms": 10}, tenant=tenants[0])
    drain()
    assert names(sent()) == ["job_queued", "job_started", "job_deferred", "job_started", "job_succeeded"]


def test_a_replaced_run_sends_job_dropped(tenants: list[Any], sent: Any) -> None:
    first = dispatch("tests.replacing", {"n": 1}, tenant=tenants[0])
    dispatch("tests.replacing", {"n": 2}, tenant=tenants[0])
    entries = sent()
    assert names(entries) == ["job_queued", "job_dropped", "job_queued"]
    assert entries[1]["run"]["run_id"] == first.run_id
    assert entries[1]["run"]["status"] == "dropped"
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.DROPPED


def test_inside_atomic_job_queued_waits_for_the_commit_and_a_rollback_sends_nothing(
    tenants: list[Any], sent: Any
) -> None:
    with transaction.atomic():
        dispatch("tests.record", {"n": 1}, tenant=tenants[0])
        assert sent() == []
    assert names(sent()) == ["job_queued"]
    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch("tests.record", {"n": 2}, tenant=tenants[0])
        raise RuntimeError("roll back")
    assert names(sent()) == ["job_queued"]


def test_fan_out_children_are_each_announced(tenants: list[Any], sent: Any) -> None:
    dispatch("tests.per_tenant", {})
    drain()
    children = [e for e in sent("tests.per_tenant") if e["signal"] == "job_queued"]
    assert sorted(e["run"]["tenant_id"] for e in children) == sorted(str(t.pk) for t in tenants)
    wrapper = names(sent("_per_tenant:tests.per_tenant"))
    assert wrapper == ["job_queued", "job_started", "job_succeeded"]


def test_a_receiver_that_raises_is_logged_and_the_job_still_succeeds(
    tenants: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: str, run: RunInfo, **kwargs: Any) -> None:
        raise ValueError("receiver bug")

    # Built at run time: an equal string, not the same object as the job's name.
    sender = ".".join(["tests", "record"])
    signals.job_succeeded.connect(broken, sender=sender)
    assert signals.job_succeeded.has_listeners(sender)
    try:
        result = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
        with caplog.at_level(logging.ERROR, logger="kumiko_jobs.signals"):
            assert drain() == {"succeeded": 1}
    finally:
        assert signals.job_succeeded.disconnect(broken, sender=sender)
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED
    (record,) = [r for r in caplog.records if r.name == "kumiko_jobs.signals"]
    assert "broken raised for run" in record.getMessage()
    # Scrubbed, as every traceback the package logs: the traceback is the record's text now.
    assert "ValueError: receiver bug" in (record.exc_text or "")


def scrub_digits(text: str) -> str:
    return "".join("#" if char.isdigit() else char for char in text)


def test_the_error_goes_through_the_configured_scrubber(settings: Any, tenants: list[Any], sent: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCRUBBER": f"{__name__}.scrub_digits"}
    dispatch("tests.unrecoverable", {}, tenant=tenants[0])
    drain()
    (final,) = [e for e in sent() if e["signal"] == "job_failed"]
    assert final["run"]["error"] == "UnrecoverableError: this cannot work"
    dispatch("tests.flaky", {"succeed_on": 99}, tenant=tenants[0])
    drain()
    last = [e for e in sent("tests.flaky") if e["signal"] == "job_failed"][-1]
    assert last["run"]["error"] == "RuntimeError: flaky failure on attempt #"


def test_canceling_waiting_runs_sends_job_dropped(tenants: list[Any], sent: Any) -> None:
    from kumiko_jobs.cancelling import cancel_queued

    later = dispatch("tests.record", {"n": 1}, tenant=tenants[0], delay=3600)
    result = cancel_queued([str(later.job_id)])
    assert result.canceled == (later.job_id,)
    entries = sent()
    assert names(entries) == ["job_queued", "job_dropped"]
    assert (entries[1]["run"]["run_id"], entries[1]["run"]["status"]) == (later.run_id, "dropped")
