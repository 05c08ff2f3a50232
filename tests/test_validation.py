"""Bad dispatch input is refused with a specific error before anything is written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from kumiko_jobs import InvalidPayload, UnknownJob, dispatch, emit
from kumiko_jobs.connection import get_keys
from kumiko_jobs.exceptions import InvalidDispatch, UnknownEvent
from kumiko_jobs.models import JobRun

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    node = payload
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    return payload


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"text": "a\x00b"}, r"\$\.text: strings must not contain NUL"),
        ({"a\x00": 1}, r"NUL"),
        ({"text": "lone \ud800 surrogate"}, r"\$\.text: the string is not valid Unicode"),
        ({"n": 10**5000}, r"\$\.n: integers must fit in 64 bits"),
        ({"n": -(2**63) - 1}, r"integers must fit in 64 bits"),
        ({"x": float("inf")}, r"not representable in JSON"),
        (nested(5000), r"nested deeper than 64 levels"),
        ({"blob": "x" * (1024 * 1024)}, r"over KUMIKO_JOBS\['MAX_PAYLOAD_BYTES'\]"),
    ],
)
def test_payload_a_record_cannot_store_is_refused(
    payload: dict[str, Any], fragment: str, redis_client: Any
) -> None:
    with pytest.raises(InvalidPayload, match=fragment):
        dispatch("tests.record", payload)
    assert not JobRun.objects.exists()
    assert not list(redis_client.scan_iter(match=f"rq:job:{get_keys().id_tag}-*"))


def test_largest_ints_and_deep_but_allowed_payloads_pass(redis_client: Any) -> None:
    assert dispatch("tests.record", {"n": 2**63 - 1, "m": -(2**63), **nested(60)}).status == "queued"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"correlation_id": "c" * 65}, r"correlation_id .* 65 characters; at most 64"),
        ({"correlation_id": "bad\nid"}, r"correlation_id .* unprintable"),
        ({"correlation_id": 42}, r"correlation_id must be a str"),
        ({"trigger_name": "t" * 201}, r"trigger_name .* at most 200"),
        ({"user": "u" * 65}, r"user id .* at most 64"),
        ({"user": "x\x00"}, r"user id .* unprintable"),
        ({"delay": float("inf")}, r"not a finite number"),
        ({"delay": float("nan")}, r"not a finite number"),
        ({"delay": 10**9}, r"over a year"),
        ({"delay": timedelta(days=400)}, r"over a year"),
        ({"delay": "10"}, r"delay must be a timedelta or seconds"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    options: dict[str, Any], fragment: str, redis_client: Any
) -> None:
    with pytest.raises(InvalidDispatch, match=fragment):
        dispatch("tests.record", {}, **options)
    # Inside atomic() the caller's transaction is not aborted: it can go on and commit.
    with transaction.atomic():
        with pytest.raises(InvalidDispatch):
            dispatch("tests.record", {}, **options)
        dispatch("tests.record", {"after": True})
    assert list(JobRun.objects.values_list("payload", flat=True)) == [{"after": True}]


def test_negative_delay_means_now() -> None:
    result = dispatch("tests.record", {}, delay=-5)
    assert JobRun.objects.get(pk=result.run_id).next_attempt_at is None


@pytest.mark.parametrize("name", [None, 42, b"tests.record", ["tests.record"]])
def test_a_name_that_is_not_a_string_is_an_unknown_job(name: Any) -> None:
    with pytest.raises(UnknownJob):
        dispatch(name, {})
    assert not JobRun.objects.exists()


def test_an_event_name_that_cannot_be_stored_is_refused() -> None:
    with pytest.raises(UnknownEvent):
        emit(42, {})  # type: ignore[arg-type]
    with pytest.raises(InvalidDispatch, match="event"):
        emit("e" * 201, {})
