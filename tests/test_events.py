"""emit(): an event nobody listens to is logged once; KUMIKO_JOBS["EVENTS"] closes the set."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kumiko_jobs import emit
from kumiko_jobs.exceptions import UnknownEvent

pytestmark = pytest.mark.django_db


def test_an_event_nobody_listens_to_warns_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        assert emit("invoice.craeted.once", {}) == []
        assert emit("invoice.craeted.once", {}) == []

    warnings = [r.getMessage() for r in caplog.records if "reached no job" in r.getMessage()]
    assert warnings == [
        "kumiko_jobs: emit('invoice.craeted.once') reached no job: no on_event trigger listens to it "
        "(logged once per event name). Check the name, or declare KUMIKO_JOBS['EVENTS']."
    ]


def test_a_listened_event_whose_filter_does_not_match_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        assert emit("invoice.paid", {"kind": "charge"}) == []
    assert "reached no job" not in caplog.text


def test_declared_events_refuse_a_typo_with_close_matches(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "EVENTS": ["invoice.created", "user.signed_up"]}

    with pytest.raises(UnknownEvent) as raised:
        emit("invoice.craeted", {})

    assert raised.value.close_matches == ["invoice.created"]
    assert str(raised.value) == (
        "Event 'invoice.craeted' is not declared in KUMIKO_JOBS['EVENTS']. Did you mean: invoice.created? "
        "Add it to that list, or fix the name."
    )
    assert [r.job_name for r in emit("invoice.created", {"id": 1})] == ["tests.on_invoice"]
