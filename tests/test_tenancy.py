"""Tenant activation, escape hatches and per-tenant fan-out (spec G 25-27, 40, 45-47)."""

from __future__ import annotations

from typing import Any

import pytest
from django_scopes import scopes_disabled

from kumiko_jobs import dispatch, emit
from kumiko_jobs.models import EscapeHatchAudit, JobRun, RunStatus
from kumiko_jobs.testing import drain
from project.demo.models import Note

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def notes(tenants: list[Any]) -> list[Any]:
    with scopes_disabled():
        return [Note.objects.create(tenant=t, text=f"note of {t.slug}") for t in tenants]


def test_handler_sees_only_its_tenant_through_scoped_managers(
    tenants: list[Any], notes: Any, traces: Any
) -> None:
    for tenant in tenants:
        dispatch("tests.notes", {}, tenant=tenant)
    drain()
    assert sorted((e["tenant"], e["seen"]) for e in traces("notes")) == sorted(
        (str(t.pk), [t.pk]) for t in tenants
    )


def test_a_run_without_a_tenant_sees_no_tenants_rows_without_a_hatch(
    tenants: list[Any], notes: Any, traces: Any
) -> None:
    """django-scopes' scope(tenant=None) filters nothing: a system run read every tenant's notes
    with no grant and no audit. Now a scoped model refuses the query (ScopeError)."""
    result = dispatch("tests.notes", {})
    drain()
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == RunStatus.FAILED and "ScopeError" in run.error
    assert traces("notes") == []


def test_cross_tenant_reads_denied_without_grant_and_nothing_audited(tenants: list[Any]) -> None:
    result = dispatch("tests.notes_unscoped_denied", {}, tenant=tenants[0])
    drain()
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == RunStatus.FAILED
    assert "EscapeHatchDenied" in run.error and 'grants=("unscoped",)' in run.error
    assert not EscapeHatchAudit.objects.exists()


def test_cross_tenant_reads_see_all_tenants_refuse_writes_and_audit_once(
    tenants: list[Any], notes: Any, traces: Any
) -> None:
    for _ in range(2):
        dispatch("tests.cross_reads", {}, tenant=tenants[0])
    drain()
    entries = traces("cross_reads")
    assert [e["seen"] for e in entries] == [[t.pk for t in tenants]] * 2
    assert [e["wrote"] for e in entries] == [False, False]
    assert "reads only" in traces("write_refused")[0]["error"]
    [audit] = EscapeHatchAudit.objects.all()
    assert (audit.kind, audit.count, audit.reason) == ("cross_tenant_reads", 2, "tests: cross-tenant report")
    assert audit.tenant_id == str(tenants[0].pk) and audit.actor == "kumiko-system"


def test_unscoped_writes_need_the_global_writes_grant(tenants: list[Any], notes: Any, traces: Any) -> None:
    """DESIGN's grants: "unscoped" reads across tenants, "global_writes" writes across them."""
    dispatch("tests.unscoped_reads", {}, tenant=tenants[0])
    dispatch("tests.unscoped_writes", {}, tenant=tenants[0])
    drain()
    by_job = {e["job"]: e for e in traces("unscoped_write")}
    assert by_job["tests.unscoped_reads"]["seen"] == [t.pk for t in tenants]
    assert not by_job["tests.unscoped_reads"]["wrote"]
    assert "global_writes" in traces("write_refused")[0]["error"]
    assert by_job["tests.unscoped_writes"]["wrote"]
    with scopes_disabled():
        assert Note.objects.filter(text="written unscoped").count() == 1


def test_a_write_is_known_behind_comments_and_in_a_with_query() -> None:
    from kumiko_jobs.escape_hatches import is_write

    assert is_write("/* traceparent='00-1' */ INSERT INTO t VALUES (1)")
    assert is_write("-- a comment\n  update t set a = 1")
    assert is_write("WITH gone AS (DELETE FROM t RETURNING id) SELECT * FROM gone")
    assert is_write("COPY t FROM STDIN")
    assert not is_write("/* x */ SELECT 1")
    assert not is_write("WITH recent AS (SELECT id FROM t) SELECT * FROM recent")


def test_per_tenant_without_tenant_source_fails_the_wrapper(settings: Any, tenants: list[Any]) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ACTIVE_TENANTS": None}
    result = dispatch("tests.per_tenant", {})
    assert drain() == {"failed": 1}
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == "failed" and "ACTIVE_TENANTS" in run.error
    dispatch("tests.record", {})
    assert drain() == {"succeeded": 1}  # the runner keeps going


def test_wrapper_failing_midway_is_retried_without_double_fan_out(
    settings: Any, tenants: list[Any], traces: Any
) -> None:
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.testapp.tenants.fails_midway_once",
    }
    result = dispatch("tests.per_tenant_retry", {})
    counts = drain()
    assert counts == {"retried": 1, "succeeded": 1 + len(tenants)}
    assert sorted(e["tenant"] for e in traces("per_tenant_retry")) == sorted(str(t.pk) for t in tenants)
    wrapper = JobRun.objects.get(pk=result.run_id)
    assert (wrapper.status, wrapper.attempt, wrapper.fanout_count) == ("succeeded", 2, len(tenants))
    assert JobRun.objects.filter(job_name="tests.per_tenant_retry").count() == len(tenants)


def test_fan_out_children_carry_their_tenant(settings: Any, tenants: list[Any], traces: Any) -> None:
    dispatch("tests.per_tenant", {}, tenant=None)
    drain()
    assert len(traces("per_tenant")) == len(tenants)
    children = JobRun.objects.filter(job_name="tests.per_tenant")
    assert {c.tenant_id for c in children} == {str(t.pk) for t in tenants}


def test_emit_skips_a_tenant_at_its_cap(tenants: list[Any], traces: Any) -> None:
    first = emit("limited.happened", {}, tenant=tenants[0])
    second = emit("limited.happened", {}, tenant=tenants[0])
    other = emit("limited.happened", {}, tenant=tenants[1])
    assert [r.status for r in first + second + other] == ["queued", "skipped", "queued"]
    assert second[0].reason == "max_per_tenant"
    drain()
    assert len(traces("limited_event")) == 2


def test_sequential_retry_keeps_attempts_and_runs_twice(traces: Any) -> None:
    result = dispatch("tests.sequential_flaky", {})
    other = dispatch("tests.sequential_flaky", {})
    assert drain() == {"retried": 2, "succeeded": 2}
    entries = traces("sequential_flaky")
    # One key, FIFO: a retry queues behind the run that was already waiting.
    assert [(e["run_id"], e["attempt"]) for e in entries] == [
        (result.run_id, 1),
        (other.run_id, 1),
        (result.run_id, 2),
        (other.run_id, 2),
    ]
    assert JobRun.objects.get(pk=result.run_id).attempt == 2


def test_audit_is_kept_when_the_handler_rolls_back(tenants: list[Any], traces: Any) -> None:
    dispatch("tests.hatch_rollback", {}, tenant=tenants[0])
    drain()
    assert len(traces("hatch_rollback")) == 1
    [audit] = EscapeHatchAudit.objects.all()
    assert (audit.job_name, audit.kind, audit.count) == ("tests.hatch_rollback", "unscoped", 1)


def test_default_activator_sets_the_current_tenant() -> None:
    from kumiko_jobs.tenancy import current_tenant_id, scopes_activator

    assert current_tenant_id() is None
    with scopes_activator("7"):
        assert current_tenant_id() == "7"
    assert current_tenant_id() is None


def test_as_user_switches_identity_with_a_grant_and_audits_it(
    tenants: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses

    from kumiko_jobs import EscapeHatch
    from kumiko_jobs.audit import flush_audits
    from kumiko_jobs.context import JobContext, JobLogger
    from kumiko_jobs.escape_hatches import acting_user
    from kumiko_jobs.registry import registry

    definition = dataclasses.replace(
        registry.get("tests.record"),
        escape_hatch=EscapeHatch("tests: act as owner", grants=("system_identity",)),
    )
    ctx = JobContext(
        job_name="tests.record", run_id="00000000-0000-0000-0000-000000000001", job_id="j",
        tenant_id=str(tenants[0].pk), attempt=1, final_attempt=True, triggered_by=None, trigger_name="",
        correlation_id="c", lane="worker", definition=definition, log=JobLogger("tests.record", 1),
    )  # fmt: skip
    with ctx.as_user("owner-42"):
        assert acting_user() == "owner-42"
    assert acting_user() is None
    assert "kind=as_user" in caplog.text and "as=owner-42" in caplog.text  # whom it acted as
    flush_audits(ctx)
    [audit] = EscapeHatchAudit.objects.all()
    assert (audit.kind, audit.reason, audit.count) == ("as_user", "tests: act as owner", 1)


def test_aliases_of_a_tenant_id_are_one_tenant_for_caps_and_records(tenants: list[Any]) -> None:
    pk = tenants[0].pk
    arabic_indic = "".join(chr(0x660 + int(digit)) for digit in str(pk))
    aliases = [pk, str(pk), f" {pk}", f"+{pk}", f"0{pk}", f"0_{pk}", arabic_indic, tenants[0]]
    results = [dispatch("tests.limited", {}, tenant=alias) for alias in aliases]
    # tests.limited allows 3 queued+running runs per tenant: aliases must not open more slots.
    assert [r.status for r in results] == ["queued"] * 3 + ["skipped"] * 5
    assert set(JobRun.objects.values_list("tenant_id", flat=True)) == {str(pk)}


def test_an_instance_of_another_model_is_not_a_tenant() -> None:
    from django.contrib.auth.models import User

    from kumiko_jobs import InvalidTenant

    user = User.objects.create(username="not-a-tenant")
    with pytest.raises(InvalidTenant, match="is a User, not a Tenant"):
        dispatch("tests.record", {}, tenant=user)
    assert not JobRun.objects.exists()


def test_a_server_side_cursor_lost_to_a_pooler_is_explained_other_errors_pass(settings: Any) -> None:
    """ACTIVE_TENANTS' iterator failing as a lost cursor does (SQLSTATE 34000, from the driver
    or wrapped by Django) becomes ImproperlyConfigured naming the cure; other errors are kept."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import ProgrammingError

    from kumiko_jobs.tenancy import active_tenant_ids

    class LostCursor(Exception):
        sqlstate = "34000"

    raised: list[BaseException] = []

    def tenants() -> Any:
        yield "1"
        raise raised[0]

    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ACTIVE_TENANTS": tenants}
    wrapped = ProgrammingError("cursor does not exist")
    wrapped.__cause__ = LostCursor()
    for error in (LostCursor("cursor does not exist"), wrapped):
        raised[:] = [error]
        with pytest.raises(ImproperlyConfigured, match='"DISABLE_SERVER_SIDE_CURSORS": True') as caught:
            list(active_tenant_ids())
        assert caught.value.__cause__ is error
    raised[:] = [ProgrammingError("something else")]
    with pytest.raises(ProgrammingError, match="something else"):
        list(active_tenant_ids())


def test_a_hatch_is_audited_when_its_handler_leaves_a_transaction_open(tenants: list[Any]) -> None:
    """The audit was written inside the transaction the handler left open, and the connection's
    clean-up rolled it back with it."""
    dispatch("tests.hatch_left_open", {}, tenant=tenants[0])
    drain()
    [audit] = EscapeHatchAudit.objects.all()
    assert (audit.job_name, audit.kind, audit.count) == ("tests.hatch_left_open", "unscoped", 1)


def test_fan_out_children_take_the_tenant_ids_dispatch_uses(
    settings: Any, tenants: list[Any], traces: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """ACTIVE_TENANTS may give instances, or ids in another spelling: the children land under
    the canonical id (the tenant's own runs, caps and history), and an item that cannot be a
    tenant id is skipped, not a failed batch for every tenant after it."""
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.testapp.tenants.instances_and_a_bad_one",
    }
    dispatch("tests.per_tenant", {})
    assert drain() == {"succeeded": 1 + len(tenants)}
    children = JobRun.objects.filter(job_name="tests.per_tenant").values_list("tenant_id", flat=True)
    assert sorted(children) == sorted(str(t.pk) for t in tenants)
    assert "ACTIVE_TENANTS gave 'xxx" in caplog.text


def test_a_fan_out_that_fails_midway_is_retried_even_when_its_job_has_no_retries(
    settings: Any, tenants: list[Any], traces: Any
) -> None:
    """tests.per_tenant has retries=0: its wrapper failed for good at the first error, and every
    tenant after it went without its run."""
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.testapp.tenants.fails_midway_once",
    }
    wrapper = dispatch("tests.per_tenant", {})
    counts = drain()
    assert counts.get("retried") == 1 and counts.get("failed") is None
    assert sorted(e["tenant"] for e in traces("per_tenant")) == sorted(str(t.pk) for t in tenants)
    assert JobRun.objects.get(pk=wrapper.run_id).status == RunStatus.SUCCEEDED


def test_no_tenant_activator_runs_jobs_with_the_current_tenant_only(
    settings: Any, tenants: list[Any]
) -> None:
    """TENANT_ACTIVATOR = None passed the checks, and every attempt then called None."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_ACTIVATOR": None}
    dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}


def test_a_fan_out_counts_the_runs_it_queued_not_the_tenants_it_listed(tenants: list[Any]) -> None:
    """A child a skip limit turns away is no run of the fan-out: fanout_count leaves it out, and
    the wrapper's log line says how many were skipped, and why."""
    from kumiko_jobs.registry import build_definition, registry
    from tests.testapp.jobs import per_tenant

    with registry.isolated():
        registry.register(
            build_definition(per_tenant, "tests.per_tenant_one", {"per_tenant": True, "max_per_tenant": 1})
        )
        dispatch("tests.per_tenant_one", {}, tenant=tenants[0], delay=60)  # holds tenant 0's one slot
        result = dispatch("tests.per_tenant_one", {})
        assert drain(timeout=0.2) == {"succeeded": len(tenants)}  # the wrapper, and all but one child
    wrapper = JobRun.objects.get(pk=result.run_id)
    assert wrapper.fanout_count == len(tenants) - 1
    assert [line["msg"] for line in wrapper.logs] == [
        f"fanned out to {len(tenants)} tenants: {len(tenants) - 1} queued, 1 skipped (max_per_tenant)"
    ]
