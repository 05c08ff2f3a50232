"""The job hash's ``data`` field: plain JSON when small, zlib when large, readable by RQ either
way (django-rq's dashboard and rq tools show our jobs through RQ's Job)."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import utcformat, utcparse

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.jobdata import COMPRESS_FROM, ENTRY_POINT, decode_payload, encode_data, rq_time
from kumiko_jobs.run_rows import encode_payload
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("size", [10, COMPRESS_FROM * 2])
def test_rq_reads_what_dispatch_stores_small_or_large(size: int, redis_client: Any, traces: Any) -> None:
    payload = {"n": "x" * size}
    result = dispatch("tests.record", payload)
    assert result.job_id is not None
    data = redis_client.hget(get_keys().job(result.job_id), "data")
    if size < COMPRESS_FROM:
        assert data.startswith(b"[")  # a few hundred bytes: compressing costs more than it saves
    else:
        assert len(data) < size / 4  # compressed
        assert zlib.decompress(data).startswith(b"[")
    job = Job.fetch(result.job_id, connection=redis_client, serializer=JSONSerializer)
    assert (job.func_name, job.args) == (ENTRY_POINT, ["tests.record", payload])
    assert decode_payload(data) == payload
    assert drain() == {"succeeded": 1}
    assert [e["payload"] for e in traces("record")] == [payload]


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("0b7c6f8e-3a1d-4c2e-9f00-5a6b7c8d9e0f", "0b7c6f8e-3a1d-4c2e-9f00-5a6b7c8d9e0f"),
        ("0B7C6F8E-3A1D-4C2E-9F00-5A6B7C8D9E0F", "0b7c6f8e-3a1d-4c2e-9f00-5a6b7c8d9e0f"),
        ("0b7c6f8e3a1d4c2e9f005a6b7c8d9e0f", "0b7c6f8e-3a1d-4c2e-9f00-5a6b7c8d9e0f"),
        ("not-a-run-id", None),
        ("0b7c6f8e-3a1d-4c2e-9f00-5a6b7c8d9e0", None),
        (12345, None),
    ],
)
def test_a_metas_run_id_is_checked_and_kept_in_its_canonical_form(run: Any, expected: str | None) -> None:
    import json

    from kumiko_jobs.exceptions import MalformedJob
    from kumiko_jobs.jobdata import JobMeta

    raw = json.dumps({"run": run, "job": "tests.record", "lane": "worker"}).encode()
    if expected is None:
        with pytest.raises(MalformedJob):
            JobMeta.from_json(raw)
    else:
        assert JobMeta.from_json(raw).run_id == expected


@pytest.mark.parametrize(
    "payload",
    [{}, {"n": 1}, {"text": 'grüße \u2603 "quoted" \\ back'}, {"nested": {"a": [1, 2.5, None, True]}}],
)
def test_data_splices_the_rows_payload_text_into_the_same_bytes_rq_would_write(payload: Any) -> None:
    # encode_data reuses the row's payload text instead of encoding the payload twice: the
    # bytes must be exactly those of encoding the whole list, which RQ's serializer reads.
    whole = json.dumps([ENTRY_POINT, None, ["tests.record", payload], {}], separators=(",", ":")).encode()
    assert encode_data("tests.record", payload) == whole
    assert encode_data("tests.record", payload, payload_json=encode_payload(payload)) == whole
    assert JSONSerializer.loads(whole) == [ENTRY_POINT, None, ["tests.record", payload], {}]


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 3, 17, 14, 9, 123456, tzinfo=UTC),
        datetime(2026, 12, 3, 17, 14, 9, tzinfo=UTC),  # no microseconds: still six digits
        datetime(2026, 1, 2, 3, 4, 5, 6),  # naive (USE_TZ off)
        datetime(2026, 6, 1, 12, 0, 0, 500, tzinfo=timezone(timedelta(hours=9))),
    ],
)
def test_rq_time_writes_what_rqs_utcformat_writes(moment: datetime) -> None:
    assert rq_time(moment) == utcformat(moment)
    assert utcparse(rq_time(moment)) == moment.replace(tzinfo=UTC)  # RQ reads its fields back


def test_a_late_pushs_dispatch_time_is_stamped_in_utc() -> None:
    """A database with its own TIME_ZONE returns a run's queued_at in its local time; the job
    hash's created_at, which a late replace push compares, must still be UTC, as every stamp."""
    from datetime import UTC, datetime, timedelta, timezone

    from kumiko_jobs.jobdata import _created_stamp, rq_time

    moment = datetime(2026, 12, 5, 13, 0, 0, 123456, tzinfo=UTC)
    berlin = moment.astimezone(timezone(timedelta(hours=1)))
    assert _created_stamp(berlin) == rq_time(moment) == "2026-12-05T13:00:00.123456Z"


def test_fan_out_ids_as_long_as_a_job_id_column_round_trip() -> None:
    """Under a 64-character QUEUE_PREFIX a per-tenant wrapper's id is over 100 characters: its
    children's meta names it, and a limit of 100 failed every child as malformed."""
    from kumiko_jobs.jobdata import JobMeta
    from kumiko_jobs.models import JOB_ID_LENGTH

    wrapper = "p" * (JOB_ID_LENGTH - 40) + "-0123456789abcdef0123456789abcdef"
    meta = JobMeta(
        run_id="01a2463f-e786-7ebc-96ee-493a29afa79c",
        job_name="x.y",
        lane="worker",
        tenant_id="1",
        triggered_by=None,
        trigger_name="",
        correlation_id="c",
        attempt=1,
        max_attempts=1,
        fanout_of=wrapper,
        fanout_parent=wrapper,
    )
    back = JobMeta.from_json(meta.to_json())
    assert (back.fanout_of, back.fanout_parent) == (wrapper, wrapper)


def test_an_exception_whose_str_raises_is_described() -> None:
    from kumiko_jobs.exceptions import text_of

    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert text_of(Odd()) == "<str() of Odd raised RuntimeError>"
    assert text_of(ValueError("plain")) == "plain"
