"""The operator console on a big run table: how long its pages take to render.

The run table gets ``rows`` generated runs in one INSERT ... SELECT (generate_series on
PostgreSQL, a recursive CTE on SQLite): 30 days of runs over 1,000 tenants and 20 job names,
mostly succeeded, 2 % failed, a few queued. Redis gets what a busy day leaves: 24 hours of
hourly counters for both lanes, 500 tenant flows holding 20,000 queued ids, 2,000 scheduled
jobs and 8 running ones. Each page is then rendered through Django's test client as a logged-in
operator (the full view, template and middleware, no network): a warm-up, then ``renders``
timed renders; the median counts. The rows are deleted afterwards (by job id prefix).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

from redis.typing import EncodableT, FieldT
from rich.console import Console

from bench.environment import BenchEnv, BenchError, delete_own_keys, delete_own_rows, vacuum_runs
from bench.results import Figure

TARGET_MS = 300.0
TENANTS = 1000
JOBS = 20
DAYS = 30


def measure_console(env: BenchEnv, rows: int, renders: int, console: Console) -> list[Figure]:
    from django.db import connection

    console.log(f"console: generating {rows:,} run rows ({connection.vendor}) and a day of Redis counters")
    started = time.perf_counter()
    generate_rows(env.prefix, rows)
    generated = time.perf_counter() - started
    fill_redis(env)
    client = operator_client()
    figures = [
        _page(client, "overview", "/admin/kumiko_jobs/consoleoverview/", rows, renders, TARGET_MS),
        # Ranking tenants over the day (a ZUNION) is cached for 30 s: the page as the first
        # operator of a minute sees it.
        _page(
            client,
            "overview, tenant ranking not cached",
            "/admin/kumiko_jobs/consoleoverview/",
            rows,
            renders,
            TARGET_MS,
            before=_forget_ranking,
        ),
        _page(client, "job catalog", "/admin/kumiko_jobs/jobcatalog/", rows, renders, None),
        _page(client, "run list, first page", "/admin/kumiko_jobs/jobrun/", rows, renders, None),
        _page(
            client,
            "run list, failed runs",
            "/admin/kumiko_jobs/jobrun/?status__exact=failed",
            rows,
            renders,
            None,
        ),
    ]
    figures.append(Figure(f"generate {rows:,} run rows", f"{generated:.1f} s", how="one INSERT ... SELECT"))
    console.log("console: deleting the generated rows")
    delete_own_rows(env.prefix)
    delete_own_keys(env.client, env.prefix)
    vacuum_runs()  # the sections after this one insert into the table these rows left
    return figures


def generate_rows(prefix: str, rows: int) -> None:
    from django.db import connection, transaction

    sql = _POSTGRES if connection.vendor == "postgresql" else _SQLITE
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.format(n=rows, prefix=prefix, tenants=TENANTS, jobs=JOBS, days=DAYS))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE kumiko_jobs_jobrun")


# Statuses by g % 100: 0-1 failed, 2 queued, 3 running, else succeeded. Newest rows last.
_COLUMNS = """id, job_name, tenant_id, status, attempt, max_attempts, subject, lane, job_id, trigger_name,
triggered_by, correlation_id, payload, queued_at, started_at, finished_at, next_attempt_at, worker, error,
traceback, logs, defer_count, fanout_count, retry_of, fanout_of, fanout_parent, tenant_visible, updated_at,
pushed_at, scheduled_at, zone"""
# Only constants and integers are formatted into these (no outside input).
_POSTGRES = (
    "INSERT INTO kumiko_jobs_jobrun ("  # noqa: S608
    + _COLUMNS
    + """)
SELECT gen_random_uuid(), 'bench.job' || (g % {jobs}), (g % {tenants})::text,
  CASE WHEN g % 100 < 2 THEN 'failed' WHEN g % 100 = 2 THEN 'queued' WHEN g % 100 = 3 THEN 'running'
       ELSE 'succeeded' END,
  1, 1, NULL, CASE WHEN g % 10 = 0 THEN 'api' ELSE 'worker' END, '{prefix}-' || g, '', NULL, md5(g::text),
  '{{}}'::jsonb, t, t + interval '5 ms', CASE WHEN g % 100 IN (2, 3) THEN NULL ELSE t + interval '20 ms' END,
  NULL, '', CASE WHEN g % 100 < 2 THEN 'RuntimeError: generated failure ' || g ELSE '' END, '', '[]'::jsonb,
  0, NULL, NULL, '', '', false, t, t, NULL, ''
FROM (SELECT g, now() - make_interval(secs => ({n} - g) * {days} * 86400.0 / {n}) AS t
      FROM generate_series(1, {n}) AS g) AS s"""
)
_SQLITE = (
    "INSERT INTO kumiko_jobs_jobrun ("  # noqa: S608
    + _COLUMNS
    + """)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n}),
  r AS (SELECT g, strftime('%Y-%m-%d %H:%M:%f', 'now',
                           '-' || (({n} - g) * {days} * 86400.0 / {n}) || ' seconds') AS t FROM s)
SELECT lower(hex(randomblob(16))), 'bench.job' || (g % {jobs}), CAST(g % {tenants} AS TEXT),
  CASE WHEN g % 100 < 2 THEN 'failed' WHEN g % 100 = 2 THEN 'queued' WHEN g % 100 = 3 THEN 'running'
       ELSE 'succeeded' END,
  1, 1, NULL, CASE WHEN g % 10 = 0 THEN 'api' ELSE 'worker' END, '{prefix}-' || g, '', NULL, hex(g),
  '{{}}', t, t, CASE WHEN g % 100 IN (2, 3) THEN NULL ELSE t END, NULL, '',
  CASE WHEN g % 100 < 2 THEN 'RuntimeError: generated failure ' || g ELSE '' END, '', '[]', 0, NULL, NULL,
  '', '', 0, t, t, NULL, ''
FROM r"""
)


def fill_redis(env: BenchEnv) -> None:
    """A day of counters, queued flows, scheduled and running jobs, through the key layout."""
    from kumiko_jobs import lane_stats
    from kumiko_jobs.connection import get_keys
    from kumiko_jobs.keys import LANES

    keys, client = get_keys(), env.client
    hour = lane_stats.current_hour()
    pipe = client.pipeline(transaction=False)
    for lane in LANES:
        for h in range(hour - 23, hour + 1):
            # Typed as redis-py's hash fields: its stub takes no plain dict[str, int] (Mapping's
            # key type is invariant).
            counts: dict[FieldT, EncodableT] = {
                "succeeded": 3000,
                "failed": 60,
                "retried": 90,
                "deferred": 10,
            }
            for job in range(JOBS):
                counts |= {f"j|bench.job{job}|succeeded": 150, f"j|bench.job{job}|failed": 3}
            pipe.hset(keys.stats(lane, h), mapping=counts)
            pipe.zadd(keys.succeeding_tenants(lane, h), {str(t): 3 for t in range(TENANTS)})
            pipe.zadd(keys.failing_tenants(lane, h), {str(t): 1 for t in range(0, TENANTS, 17)})
        pipe.set(keys.queued_count(lane), 500 * 20)
        for tenant in range(500):
            flow = f"t|{tenant}"
            pipe.hset(keys.flow_states(lane), flow, "r")
            pipe.rpush(keys.flow(lane, flow), *(f"{env.prefix}-q{tenant}-{i}" for i in range(20)))
        for i in range(1000):
            job_id = f"{env.prefix}-s-{lane}-{i}"
            pipe.zadd(keys.scheduled(lane), {job_id: time.time() + 3600})
            pipe.hset(keys.job(job_id), "meta", json.dumps({"tenant": str(i % TENANTS)}))
        for i in range(4):
            job_id = f"{env.prefix}-r-{lane}-{i}"
            pipe.zadd(keys.started(lane), {f"{job_id}:x": time.time() + 60})
            pipe.hset(keys.job(job_id), "meta", json.dumps({"tenant": str(i)}))
    pipe.execute()


def operator_client() -> object:
    from django.contrib.auth import get_user_model
    from django.test import Client

    operator = {"is_superuser": True, "is_staff": True}
    user, _ = get_user_model().objects.get_or_create(username="bench-operator", defaults=operator)
    client = Client()
    client.force_login(user)
    return client


def _forget_ranking() -> None:
    from kumiko_jobs import lane_stats

    lane_stats._rank_cache.clear()


def _page(
    client: object,
    label: str,
    url: str,
    rows: int,
    renders: int,
    target_ms: float | None,
    before: Callable[[], None] = lambda: None,
) -> Figure:
    def render() -> None:
        before()
        response = client.get(url)  # type: ignore[attr-defined]
        if response.status_code != 200:
            raise BenchError(f"{url} answered {response.status_code}")

    times = _timed(render, renders)
    median = statistics.median(times)
    met = None if target_ms is None else median < target_ms
    return Figure(
        f"{label} with {rows:,} runs",
        f"{median:,.0f} ms",
        target=f"< {target_ms:.0f} ms" if target_ms else "",
        met=met,
        how=f"median of {renders} renders (range {min(times):,.0f}..{max(times):,.0f} ms), after 2 warm-up",
    )


def _timed(call: Callable[[], None], renders: int) -> list[float]:
    for _ in range(2):
        call()
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times
