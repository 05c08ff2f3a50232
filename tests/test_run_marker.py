"""The running marker (run_marker.py): a run that lasts is marked running by one thread for all
job threads; a slow job_started receiver of one run must not hold up the other threads."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from kumiko_jobs import dispatch, signals
from kumiko_jobs.attempt_records import Started
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Claim, finish_and_claim
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.run_marker import RunningMarker

pytestmark = pytest.mark.django_db(transaction=True)


def _claimed() -> tuple[JobMeta, Started]:
    dispatch("tests.record", {"n": 1})
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "m", time.time() + 60))
    assert job is not None
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="w", at=datetime.now(UTC))
    return JobMeta.from_json(job.meta_raw), start


def test_a_slow_job_started_receiver_holds_up_only_its_own_run() -> None:
    slow_meta, slow_start = _claimed()
    quick_meta, quick_start = _claimed()
    in_receiver = threading.Event()
    order: list[str] = []

    def receiver(sender: Any, run: Any, **kwargs: Any) -> None:
        if run.run_id == slow_meta.run_id:
            in_receiver.set()
            time.sleep(1.0)  # a webhook that takes its time
            order.append("signal done")

    signals.job_started.connect(receiver)
    marker = RunningMarker(0.01)
    marker.start()
    slow_finished: list[bool] = []

    def slow_thread() -> None:
        marker.started(slow_meta, slow_start)
        assert in_receiver.wait(5)
        slow_finished.append(marker.finishing())  # waits for its own mark and signal
        order.append("finished")

    try:
        thread = threading.Thread(target=slow_thread)
        thread.start()
        assert in_receiver.wait(5)
        # Another job thread starts and ends a run while the slow receiver runs.
        began = time.monotonic()
        marker.started(quick_meta, quick_start)
        assert marker.finishing() is False  # not due yet: its outcome records the start
        assert time.monotonic() - began < 0.5
        thread.join(5)
        assert slow_finished == [True]
        assert order == ["signal done", "finished"]  # its outcome came after its job_started
        assert JobRun.objects.get(pk=slow_meta.run_id).status == RunStatus.RUNNING
    finally:
        signals.job_started.disconnect(receiver)
        marker.stop()
        marker.join(5)
