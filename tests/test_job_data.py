"""The job hash's ``data`` field: plain JSON when small, zlib when large, readable by RQ either
way (django-rq's dashboard and rq tools show our jobs through RQ's Job)."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.jobdata import COMPRESS_FROM, ENTRY_POINT, decode_payload
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
