"""Smoke test of the benchmarks: ``python -m bench --quick`` runs end to end and reports every row.

Only that it runs and what it reports are checked, never how fast: timings on a shared machine
are not a pass/fail matter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.db import connection

from kumiko_jobs.conf import redis_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# The label cell of every row a --quick run must report (BENCHMARKS.md layout: one line a row).
ROWS = (
    "cpus (nproc)",
    "redis-server",
    "database",
    "load average at end",
    "dispatch()",
    "rq Queue.enqueue",
    "runjobs --lane worker",
    "rq SimpleWorker",
    "rq Worker (fork per job)",
    "runjobs --processes 1",
    "runjobs --processes 2",
    "dispatch() / rq Queue.enqueue",
    "Task.enqueue()",
    "dispatch() (same run)",
    "Task.enqueue() / dispatch()",
    "runjobs / rq SimpleWorker",
    "runjobs / rq Worker (fork)",
    "runjobs --processes 2 / --processes 1",
    "runjobs (1 thread) db connections opened over 200 jobs",
    "dispatch() (enqueue side)",
    "runjobs (worker side, per executed job)",
    "runjobs (worker side, incl. start-up)",
    "rq SimpleWorker",
    "quiet tenant's start behind 1,000 runs of one tenant (runjobs)",
    "quiet tenant's start behind 1,000 jobs of one tenant (rq SimpleWorker, FIFO)",
    "quiet tenant's start behind 50 tenants x 5 runs (runjobs)",
    "runjobs, 200 trivial jobs of 1 tenant",
    "runjobs, 200 trivial jobs of 50 tenants x 4",
    "fairness cost: 50-tenant rate / 1-tenant rate",
    "dispatch() max_per_tenant=1000, empty lane",
    "dispatch() max_per_tenant=1000, 2,000 runs of other tenants queued",
    "time per dispatch: deep queue / empty lane",
    "fan-out to 500 tenants (run_fan_out)",
    "rq Queue.enqueue_many, 500 jobs",
    "fan-out / enqueue_many",
    "trivial: runjobs 1x8 (--processes 1 --threads 8)",
    "trivial: Dramatiq 1x8",
    "trivial: Celery threads 8",
    "20 ms: runjobs 1x8 (--processes 1 --threads 8)",
    "20 ms: Dramatiq 1x8",
    "20 ms: Celery threads 8",
    "20 ms: rq SimpleWorker",
    "trivial: runjobs 1x8 / Dramatiq 1x8",
    "trivial: runjobs 1x8 / Celery threads 8",
    "20 ms: runjobs 1x8 jobs/s",
    "20 ms: runjobs 1x8 / Dramatiq 1x8",
    "20 ms: runjobs 1x8 / Celery threads 8",
    "20 ms: runjobs 1x8 / rq SimpleWorker",
    "leader cost per tick (tz=tenant)",
    "zone index rebuild",
    "runjobs, no OpenTelemetry SDK",
    "runjobs, SDK without exporter",
    "runjobs, SDK exporting",
    "runjobs CPU per job: without SDK / with SDK (no exporter)",
)
# Every runjobs rate row reports the database connections its worker processes opened.
CONNECTION_ROWS = (
    "runjobs --lane worker",
    "runjobs --processes 1",
    "runjobs --processes 2",
    "trivial: runjobs 1x8 (--processes 1 --threads 8)",
    "20 ms: runjobs 1x8 (--processes 1 --threads 8)",
)
# Where Dramatiq and Celery put their keys by default: the bench must have namespaced them all.
PEER_DEFAULT_KEYS = ("dramatiq:*", "celery*", "_kombu.*", "unacked*")


def _peer_default_keys(client: redis.Redis) -> set[bytes]:
    return {key for pattern in PEER_DEFAULT_KEYS for key in client.scan_iter(match=pattern, count=1000)}


def _row(markdown: str, label: str) -> str | None:
    found = re.search(rf"^\| {re.escape(label)} \|.*$", markdown, re.MULTILINE)
    return found.group(0) if found else None


# The quick bench takes ~35 s alone and ~50 s beside three other test processes on two cores:
# room for a slower machine above pytest's default 120 s.
@pytest.mark.timeout(300)
def test_quick_bench_reports_every_row_and_cleans_up(
    kumiko_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = {**os.environ, "KUMIKO_REDIS_URL": redis_url()}
    foreign_before = _peer_default_keys(redis_client)
    # The bench migrates a temporary SQLite database of its own; the test database stays untouched.
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--prefix",
            kumiko_prefix,
            "--markdown",
            str(tmp_path / "b.md"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    markdown = (tmp_path / "b.md").read_text()
    missing = [label for label in ROWS if _row(markdown, label) is None]
    missing += [
        label
        for label in CONNECTION_ROWS
        if not re.search(r"<= \d+ db connections", _row(markdown, label) or "")
    ]
    assert not missing, markdown
    for label in ("dispatch()", "rq Queue.enqueue"):
        # Thousands are grouped (1,218 us) on a loaded machine.
        assert re.search(r"[\d,]+ us CPU and [\d,]+ us waiting a call", _row(markdown, label) or ""), markdown
    besides = r"CPU a call besides this process: Redis [\d,]+ us"
    assert re.search(besides + r"\s*\|", _row(markdown, "rq Queue.enqueue") or ""), markdown
    # The quick bench runs on SQLite (above), whose work is the bench process's own.
    assert re.search(f"{besides}, sqlite works in this process", _row(markdown, "dispatch()") or ""), markdown
    assert not list(redis_client.scan_iter(match=f"*{kumiko_prefix}*"))
    assert _peer_default_keys(redis_client) - foreign_before == set()


def test_connections_opened_reads_every_shutdown_line() -> None:
    from bench.children import connections_opened

    output = (
        b"... worker a-p1 stopped after 10 jobs {'succeeded': 10}; database connections opened: 1\n"
        b"... worker a-p2 stopped after 0 jobs {}; database connections opened: 12\n"
    )
    assert connections_opened(output) == [1, 12]
    assert connections_opened(b"no shutdown line") == []


def test_commands_per_executed_job_subtract_the_empty_lane_run() -> None:
    from bench.command_counts import TARGET_PER_JOB, per_executed_job
    from bench.results import CommandCount

    run = CommandCount(
        "run", 200, total=2030, scripts=202, top=[("evalsha", 202), ("del", 200), ("zadd", 2), ("hello", 3)]
    )
    fixed = CommandCount(
        "empty", 1, total=30, scripts=2, top=[("evalsha", 2), ("hello", 3), ("sadd", 1), ("lrem", 3)]
    )
    per_job = per_executed_job(run, fixed, "per executed job")
    assert (per_job.total, per_job.scripts, per_job.jobs) == (2000, 200, 200)
    # Differences under one call per 100 jobs (sadd -1) are not listed; the total keeps them.
    assert per_job.top == [("evalsha", 200), ("del", 200), ("zadd", 2), ("lrem", -3)]
    assert (per_job.per_job, per_job.target, per_job.met) == (10.0, TARGET_PER_JOB, True)


def test_upper_bound_ratios_and_counts() -> None:
    from bench.results import Ratio

    connections = Ratio("connections", 3, 2, at_most=True, fmt="d")
    assert (connections.shown, connections.bound, connections.met) == ("3", "<= 2", False)
    scaling = Ratio("scaling", 1.62, 1.5)
    assert (scaling.shown, scaling.bound, scaling.met) == ("1.62", ">= 1.5", True)


def test_a_ratio_that_rounds_onto_its_target_is_shown_with_the_digits_that_tell_which_side() -> None:
    from bench.results import Ratio

    # 376.0 jobs/s against Dramatiq's 376.6: "1.00" would say "NO" beside a figure that reads met.
    io = Ratio("io", 376.0 / 376.6, 1.0)
    assert (io.shown, io.met) == ("0.998", False)
    assert Ratio("io", 0.99999, 1.0).shown == "0.9999"  # the most digits shown (still "NO")
    assert Ratio("limit", 10.004, 10.0, at_most=True).shown == "10.004"
    # An upper bound exceeded by less than the last digit shown is cut upwards (still "NO").
    assert Ratio("limit", 10.00001, 10.0, at_most=True).shown == "10.0001"
    assert Ratio("limit", 9.99999, 10.0, at_most=True).shown == "10.00"  # met, and reads met
    assert Ratio("io", 1.004, 1.0).shown == "1.00"  # rounding that keeps the side: as it was


@pytest.mark.django_db
def test_overlap_is_the_span_in_which_every_worker_process_worked() -> None:
    from datetime import UTC, datetime, timedelta

    from bench.environment import BenchError
    from bench.timing import recorded_overlap
    from kumiko_jobs.models import JobRun, RunStatus

    t0 = datetime(2026, 12, 4, tzinfo=UTC)

    def runs(tag: str, worker: str, starts: range) -> list[JobRun]:
        return [
            JobRun(
                job_name="bench.noop",
                status=RunStatus.SUCCEEDED,
                lane="worker",
                job_id=f"{tag}-{worker}-{tenth}",
                correlation_id=tag,
                worker=worker,
                queued_at=t0,
                started_at=t0 + timedelta(seconds=tenth / 10),
                finished_at=t0 + timedelta(seconds=tenth / 10 + 0.05),
            )
            for tenth in starts
        ]

    # p1 works from 0.0 to 0.95 s, p2 (started late) from 0.2 to 0.75 s.
    JobRun.objects.bulk_create(
        runs("two", "w-p1", range(10)) + runs("two", "w-p2", range(2, 8)) + runs("other", "w-p3", range(3))
    )
    two = recorded_overlap("two")
    assert (two.workers, two.jobs) == (2, 12)  # 0.2..0.7 of each: claimed and finished in the span
    assert (round(two.seconds, 6), round(two.stagger, 6)) == (0.55, 0.2)
    # One process: the whole round.
    one = recorded_overlap("other")
    assert (one.workers, one.jobs, round(one.seconds, 6), one.stagger) == (1, 3, 0.25, 0.0)

    # Never working at one moment (p1 0.0-0.25 s, p2 0.5-0.65 s: a short round on a busy machine):
    # the whole round, as one process working, which the rate's note counts.
    JobRun.objects.bulk_create(runs("apart", "w-p1", range(3)) + runs("apart", "w-p2", range(5, 7)))
    apart = recorded_overlap("apart")
    assert (apart.workers, apart.jobs, round(apart.seconds, 6), round(apart.stagger, 6)) == (1, 5, 0.65, 0.5)
    with pytest.raises(BenchError, match="no run of nothing succeeded"):
        recorded_overlap("nothing")


def test_cpu_sampler_answers_for_the_samples_inside_a_span() -> None:
    from bench.machine_cpu import CpuSampler, Sample

    sampler = CpuSampler(cpus=2)
    # (all, idle) ticks: 2 cores, 100 ticks a second in all; 150 of 200 busy from 1.0 to 2.0.
    sampler.samples = [
        Sample(0.5, (0, 0)),
        Sample(1.0, (100, 50)),
        Sample(2.0, (300, 100)),
        Sample(3.0, (500, 300)),
    ]
    assert sampler.busy_between(0.9, 2.1) == 1.5  # the samples at 1.0 and 2.0
    assert sampler.busy_between(0.0, 3.0) == 0.8  # 0.5 to 3.0: 200 of 500 busy
    assert sampler.busy_between(1.1, 1.9) is None  # no two samples inside
    assert CpuSampler(cpus=2).busy_between(0.0, 9.0) is None


def test_cpu_sampler_sees_a_busy_core() -> None:
    """The real /proc/stat: a thread spinning for 0.3 s keeps about one core busy (more when
    the machine has other work; the whole machine is counted)."""
    import time

    from bench.machine_cpu import CpuSampler

    if not Path("/proc/stat").exists():
        pytest.fail("the bench reads /proc/stat: Linux only")
    with CpuSampler() as sampler:
        start = time.time()
        while time.time() - start < 0.3:
            pass
        end = time.time()
    busy = sampler.busy_between(start, end)
    assert busy is not None
    assert 0.7 <= busy <= (os.cpu_count() or 1)


def test_processes_ceiling_is_all_cores_at_the_measured_cpu_a_job() -> None:
    from bench.results import Rate
    from bench.worker_rate import Load, ceiling_note, load_note

    one = Rate("runjobs --processes 1", 10_000, [5.0])  # 2,000/s
    loads = [Load(1.8, 0.000_600), Load(1.7, 0.000_625), Load(1.9, 0.000_640)]
    cpus = os.cpu_count() or 1
    most = cpus / 0.000_625
    assert (
        ceiling_note(loads, one)
        == f"{cpus} cores at that CPU a job allow {most:,.0f}/s, {most / 2000:.2f}x of one process"
    )
    assert load_note(loads) == f"machine busy 1.8 of {cpus} cores meanwhile, 625 us CPU a job"


@pytest.mark.django_db
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a PostgreSQL backend's CPU")
def test_the_dispatch_rows_read_the_cpu_of_this_connections_backend() -> None:
    from bench.dispatch_rate import _backend_pid
    from bench.machine_cpu import process_cpu

    backend = _backend_pid()
    assert backend is not None  # the suite's PostgreSQL runs on this machine
    before = process_cpu(backend)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    after = process_cpu(backend)
    assert before is not None and after is not None
    assert after - before >= 0.05, (before, after)  # the query's CPU, in this backend
