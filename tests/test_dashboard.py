"""django-rq's dashboard on kumiko lanes: real counts and job lists, writes that keep flows and
limits consistent, and operators only. Real Redis, real views through Django's test client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from django_rq.settings import get_queues_list

from kumiko_jobs import dispatch
from kumiko_jobs.cancelling import cancel_queued
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.repair import repair_stale_runs
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def queue_index(lane: str) -> int:
    """django-rq's index of a lane's queue (its URLs number queues by sorted name)."""
    names = [config["name"] for config in get_queues_list()]
    return names.index(get_keys().queue_name(lane))


def limit_count(redis_client: Any, tenant: Any) -> int:
    """Queued+running runs of tests.limited (max_per_tenant=3) that count against the tenant."""
    return int(redis_client.hget(get_keys().active, f"m|tests.limited|{tenant.pk}") or 0)


def staff(django_user_model: Any, username: str, *, dashboard: bool = False) -> Client:
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    if dashboard:
        user.user_permissions.add(Permission.objects.get(codename="use_rq_dashboard"))
    client = Client()
    client.force_login(user)
    return client


def test_queue_list_and_job_list_show_both_lanes_and_delete_releases_the_limit_once(
    admin_client: Client, redis_client: Any, tenants: list[Any], settings: Any
) -> None:
    acme, globex, _ = tenants
    limited = [dispatch("tests.limited", {"n": i}, tenant=acme) for i in range(2)]
    other = dispatch("tests.record", {}, tenant=globex)
    api = dispatch("tests.api_record", {}, tenant=globex)
    assert limit_count(redis_client, acme) == 2

    page = admin_client.get("/django-rq/")
    assert page.status_code == 200
    counts = {queue["name"]: queue["jobs"] for queue in page.context["queues"]}
    assert counts == {get_keys().queue_name("worker"): 3, get_keys().queue_name("api"): 1}
    assert get_keys().queue_name("api") in page.content.decode()

    worker_list = admin_client.get(f"/django-rq/queues/{queue_index('worker')}/").content.decode()
    assert all(r.job_id in worker_list for r in [*limited, other])
    assert api.job_id in admin_client.get(f"/django-rq/queues/{queue_index('api')}/").content.decode()

    gone = limited[0]
    url = f"/django-rq/queues/{queue_index('worker')}/{gone.job_id}/delete/"
    assert admin_client.get(url).status_code == 200  # django-rq's confirmation page
    response = admin_client.post(url)
    assert response.status_code == 302
    assert limit_count(redis_client, acme) == 1
    assert not redis_client.exists(get_keys().job(gone.job_id))
    run = JobRun.objects.get(pk=gone.run_id)
    assert run.status == RunStatus.DROPPED and "operator" in run.error
    worker_list = admin_client.get(f"/django-rq/queues/{queue_index('worker')}/")
    assert worker_list.context["num_jobs"] == 2 and gone.job_id not in worker_list.content.decode()

    # Deleting it again changes nothing; stale-run repair never releases the limit a second time.
    admin_client.post(url)
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ABANDON_AFTER": 0.02, "HEARTBEAT_INTERVAL": 0.01}
    JobRun.objects.filter(pk=gone.run_id).update(updated_at=run.updated_at.replace(year=2000))
    repair_stale_runs(redis_client, get_keys(), "worker")
    assert limit_count(redis_client, acme) == 1
    assert drain() == {"succeeded": 3}
    assert limit_count(redis_client, acme) == 0
    assert not redis_client.hexists(get_keys().active, f"m|tests.limited|{acme.pk}")  # never negative


def test_requeue_takes_the_limit_again_and_refuses_a_full_one(
    admin_client: Client, redis_client: Any, tenants: list[Any], settings: Any
) -> None:
    # Finished jobs stay in Redis (and in the dashboard) only with RESULT_TTL > 0.
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "RESULT_TTL": 600}
    acme = tenants[0]
    first = dispatch("tests.limited", {}, tenant=acme)
    assert cancel_queued([first.job_id]).canceled == (first.job_id,)
    assert limit_count(redis_client, acme) == 0
    url = f"/django-rq/queues/{queue_index('worker')}/{first.job_id}/requeue/"
    admin_client.post(url)
    assert limit_count(redis_client, acme) == 1
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.QUEUED
    for _ in range(2):
        dispatch("tests.limited", {}, tenant=acme)
    assert drain() == {"succeeded": 3}
    assert limit_count(redis_client, acme) == 0
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.SUCCEEDED

    # A finished run requeued while the tenant is at its limit is refused, with the reason.
    for _ in range(3):
        dispatch("tests.limited", {}, tenant=acme)
    response = admin_client.post(url)
    assert "limit is full" in " ".join(str(m) for m in get_messages(response.wsgi_request))
    assert limit_count(redis_client, acme) == 3
    assert redis_client.hget(get_keys().job(first.job_id), "status") == b"finished"


def test_bulk_delete_and_empty_queue_cancel_through_kumiko(
    admin_client: Client, redis_client: Any, tenants: list[Any]
) -> None:
    acme = tenants[0]
    runs = [dispatch("tests.limited", {}, tenant=acme) for _ in range(3)]
    index = queue_index("worker")
    admin_client.post(
        f"/django-rq/queues/actions/{index}/", {"action": "delete", "job_ids": [runs[0].job_id]}
    )
    assert limit_count(redis_client, acme) == 2
    admin_client.post(f"/django-rq/queues/{index}/empty/")
    assert limit_count(redis_client, acme) == 0
    assert {r.status for r in JobRun.objects.all()} == {RunStatus.DROPPED}
    assert drain() == {}


def test_running_jobs_are_not_deleted_or_stopped(admin_client: Client, redis_client: Any) -> None:
    result = dispatch("tests.record", {})
    # What a worker's claim leaves: the hash says started (no worker runs in this test).
    redis_client.hset(get_keys().job(result.job_id), "status", "started")
    index = queue_index("worker")
    response = admin_client.post(f"/django-rq/queues/{index}/{result.job_id}/delete/")
    assert "a worker runs it" in " ".join(str(m) for m in get_messages(response.wsgi_request))
    assert redis_client.exists(get_keys().job(result.job_id))
    response = admin_client.post(f"/django-rq/queues/{index}/{result.job_id}/stop/")
    assert "cannot be stopped alone" in " ".join(str(m) for m in get_messages(response.wsgi_request))


def test_front_page_leaves_abandoned_runs_to_kumikos_reaper(admin_client: Client, redis_client: Any) -> None:
    result = dispatch("tests.record", {})
    keys = get_keys()
    # A run whose worker died: its lease expired in the started registry.
    redis_client.hset(keys.job(result.job_id), "status", "started")
    redis_client.zadd(keys.started("worker"), {f"{result.job_id}:x1": 1.0})
    assert admin_client.get("/django-rq/").status_code == 200
    assert redis_client.zscore(keys.started("worker"), f"{result.job_id}:x1") == 1.0
    assert redis_client.hget(keys.job(result.job_id), "status") == b"started"


def test_only_operators_reach_the_dashboard(
    client: Client, django_user_model: Any, redis_client: Any, tenants: list[Any]
) -> None:
    result = dispatch("tests.limited", {"secret": "payload"}, tenant=tenants[0])
    index = queue_index("worker")
    tenant_staff = staff(django_user_model, "staff-acme")
    urls = ["/django-rq/", f"/django-rq/queues/{index}/", f"/django-rq/queues/{index}/{result.job_id}/"]
    for url in urls:
        assert tenant_staff.get(url).status_code == 403, url
        in_admin = "/admin" + url.replace("/django-rq", "/django_rq/dashboard")
        assert tenant_staff.get(in_admin).status_code == 403, in_admin
    assert tenant_staff.post(f"/django-rq/queues/{index}/{result.job_id}/delete/").status_code == 403
    assert redis_client.exists(get_keys().job(result.job_id))
    assert tenant_staff.get("/django-rq/stats.json").status_code == 403
    assert "Django-RQ" not in tenant_staff.get("/admin/").content.decode()
    assert client.get("/django-rq/").status_code == 302  # anonymous: to the login page

    operator = staff(django_user_model, "ops", dashboard=True)
    for url in urls:
        assert operator.get(url).status_code == 200, url
    assert "Django-RQ" in operator.get("/admin/").content.decode()
    assert operator.get(f"/admin/django_rq/dashboard/queues/{index}/").status_code == 200
    in_admin = operator.get("/admin/django_rq/dashboard/")  # the admin link's page: the front page
    assert in_admin.status_code == 200 and get_keys().queue_name("worker") in in_admin.content.decode()
    assert operator.get("/django-rq/stats.json").json()["queues"]


def test_stats_json_accepts_the_api_token(client: Client, settings: Any) -> None:
    settings.RQ_API_TOKEN = "s3cret"
    assert client.get("/django-rq/stats.json").status_code == 401
    response = client.get("/django-rq/stats.json", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200


def test_rqstats_counts_the_lanes(capsys: Any, tenants: list[Any]) -> None:
    for tenant in tenants:
        dispatch("tests.record", {}, tenant=tenant)
    dispatch("tests.api_record", {})
    call_command("rqstats", "--json")
    printed = json.loads(capsys.readouterr().out)
    counts = {q["name"]: q["jobs"] for q in printed["queues"]}
    assert counts == {get_keys().queue_name("worker"): 3, get_keys().queue_name("api"): 1}


def test_a_tenants_staff_with_the_dashboard_permission_still_stays_out(
    django_user_model: Any, settings: Any, tenants: list[Any]
) -> None:
    """The dashboard shows every tenant's jobs and payloads: a support group given all of
    kumiko_jobs' permissions must not reach it through its tenant staff."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "USER_TENANT": "tests.conftest.tenant_of_staff"}
    tenant_staff = staff(django_user_model, "staff-acme", dashboard=True)
    assert tenant_staff.get("/django-rq/").status_code == 403
    assert tenant_staff.get("/django-rq/stats.json").status_code == 403
    assert staff(django_user_model, "ops", dashboard=True).get("/django-rq/").status_code == 200


def test_a_canceled_job_whose_record_was_not_written_keeps_its_hash(
    admin_client: Client, redis_client: Any
) -> None:
    """Canceled during a database outage (the row still says queued), then deleted again: the
    hash is what lets repair drop the row. Deleted, repair pushed the run from its record, and
    the job the operator canceled ran."""
    result = dispatch("tests.record", {})
    redis_client.hset(get_keys().job(result.job_id), "status", "canceled")  # the row stayed queued
    index = queue_index("worker")
    response = admin_client.post(f"/django-rq/queues/{index}/{result.job_id}/delete/")
    assert "does not say it ended yet" in " ".join(str(m) for m in get_messages(response.wsgi_request))
    assert redis_client.exists(get_keys().job(result.job_id))
    JobRun.objects.filter(pk=result.run_id).update(status=RunStatus.DROPPED, finished_at=timezone.now())
    admin_client.post(f"/django-rq/queues/{index}/{result.job_id}/delete/")
    assert not redis_client.exists(get_keys().job(result.job_id))  # settled: deleted


def test_a_lane_job_reached_through_another_queues_url_still_goes_through_kumiko(
    admin_client: Client, redis_client: Any, tenants: list[Any], settings: Any
) -> None:
    """django-rq numbers queues in its URLs: a lane job's delete or requeue under another
    queue's number must not be RQ's (a hash deleted behind its limit and its run record)."""
    from kumiko_jobs.connection import redis_target

    settings.RQ_QUEUES = {"default": {"URL": redis_target().raw}}  # a project's own RQ queue
    acme = tenants[0]
    run = dispatch("tests.limited", {}, tenant=acme)
    names = [config["name"] for config in get_queues_list()]
    other = names.index("default")
    response = admin_client.post(f"/django-rq/queues/{other}/{run.job_id}/delete/")
    assert response.status_code == 302
    assert limit_count(redis_client, acme) == 0  # cancelled through kumiko: its limit released
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.DROPPED
    assert drain() == {}

    again = dispatch("tests.limited", {}, tenant=acme)
    admin_client.post(f"/django-rq/queues/actions/{other}/", {"action": "delete", "job_ids": [again.job_id]})
    assert JobRun.objects.get(pk=again.run_id).status == RunStatus.DROPPED
    assert limit_count(redis_client, acme) == 0


def test_a_selection_mixing_lane_and_other_jobs_on_another_queues_page_acts_on_the_lane_jobs_only(
    admin_client: Client, redis_client: Any, tenants: list[Any], settings: Any
) -> None:
    """RQ's action would delete all of them, the lane job behind kumiko's back: kumiko cancels
    the lane job, leaves the project's own job alone, and says so."""
    import django_rq

    from kumiko_jobs.connection import redis_target

    settings.RQ_QUEUES = {"default": {"URL": redis_target().raw}}
    run = dispatch("tests.limited", {}, tenant=tenants[0])
    own = django_rq.get_queue("default").enqueue("os.getcwd")
    try:
        other = [config["name"] for config in get_queues_list()].index("default")
        response = admin_client.post(
            f"/django-rq/queues/actions/{other}/", {"action": "delete", "job_ids": [run.job_id, own.id]}
        )
        assert response.status_code == 302
        assert JobRun.objects.get(pk=run.run_id).status == RunStatus.DROPPED
        assert redis_client.exists(own.key) == 1  # RQ's own job: not deleted
        said = " ".join(str(m) for m in get_messages(response.wsgi_request))
        assert f"Did not delete 1 job(s): {own.id} (not a kumiko job" in said
    finally:
        own.delete()
