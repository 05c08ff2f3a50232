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
