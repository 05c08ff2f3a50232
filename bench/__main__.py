"""``python -m bench [--quick] [--db sqlite|URL] [--only ...] [--profile FILE]``: see BENCHMARKS.md.

Runs every measurement in this one invocation so the sides share the machine's state, prints
rich tables and (full runs) rewrites this database engine's block of BENCHMARKS.md. Exit code
0 whether or not targets are met (timings are not a pass/fail matter); 1 when the bench itself
could not run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import redis
from rich.console import Console

from bench.environment import (
    ROOT,
    BenchEnv,
    BenchError,
    bench_database,
    check_prefix,
    delete_own_keys,
    delete_own_rows,
    load_average,
    machine_facts,
    new_prefix,
    own_keys,
    setup_django,
)
from bench.peer_rates import FULL as PEERS_FULL
from bench.peer_rates import QUICK as PEERS_QUICK
from bench.peer_rates import PeerSizes
from bench.results import Rate, Ratio, Report, paired_ratios
from bench.schedules import FULL as SCHEDULES_FULL
from bench.schedules import QUICK as SCHEDULES_QUICK
from bench.schedules import Plan as SchedulePlan
from bench.tenancy import FULL as TENANCY_FULL
from bench.tenancy import QUICK as TENANCY_QUICK
from bench.tenancy import Sizes

SECTIONS = (
    "dispatch",
    "tasks",
    "workers",
    "commands",
    "tenancy",
    "peers",
    "schedules",
    "observability",
    "console",
)


@dataclass(frozen=True)
class Plan:
    """How many jobs each measurement uses. Sized so a full run stays under ~4 minutes on 2 cores."""

    dispatch: int  # calls per side and round of the enqueue comparisons
    enqueue_rounds: int  # their rounds: many short ones, paired (bench/dispatch_rate.py)
    rounds: int
    worker: int
    fork: int
    processes: int  # trivial jobs per run of runjobs --processes 1 and --processes 2
    process_rounds: int  # their rounds
    commands: int
    tenancy: Sizes
    peers: PeerSizes
    schedules: SchedulePlan
    console_rows: int
    console_renders: int
    # Observability compares sides a few percent apart: more rounds for a steadier median.
    observability_rounds: int = 1


# The forking Worker runs ~65 jobs/s here, so it gets fewer jobs than the others.
FULL = Plan(
    dispatch=600,
    enqueue_rounds=15,
    rounds=3,
    worker=2000,
    fork=400,
    processes=10_000,
    process_rounds=5,
    commands=500,
    tenancy=TENANCY_FULL,
    peers=PEERS_FULL,
    schedules=SCHEDULES_FULL,
    console_rows=1_000_000,
    console_renders=10,
    observability_rounds=5,
)
QUICK = Plan(
    dispatch=200,
    enqueue_rounds=2,
    rounds=1,
    worker=200,
    fork=30,
    processes=300,
    process_rounds=1,
    commands=100,
    tenancy=TENANCY_QUICK,
    peers=PEERS_QUICK,
    schedules=SCHEDULES_QUICK,
    console_rows=20_000,
    console_renders=3,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="Small counts: a smoke test, not figures.")
    parser.add_argument(
        "--db",
        default=None,
        help="'sqlite' (a temporary file, the default) or a database URL; default: $DATABASE_URL if set.",
    )
    parser.add_argument(
        "--prefix",
        default=None,
        help="Redis key prefix (default: $KUMIKO_BENCH_PREFIX or bench_<random>); must not be in use.",
    )
    parser.add_argument("--only", action="append", choices=SECTIONS, help="Run only this part (repeatable).")
    parser.add_argument(
        "--profile", type=Path, help="Run our worker under cProfile, dump to FILE, print a summary."
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="Where to keep the results (default: BENCHMARKS.md after a complete full run, else nowhere).",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Not a terminal (make, CI, the smoke test): a fixed width keeps rows on one line each.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        report, engine = run(args, argv, console)
    except BenchError as exc:
        console.print(f"[bold red]bench failed:[/] {exc}")
        return 1
    from bench.report import markdown_section, print_report, write_markdown

    print_report(report, console)
    # Only a complete full run replaces the figures kept in BENCHMARKS.md.
    complete = not args.quick and not args.only
    markdown = args.markdown or (ROOT / "BENCHMARKS.md" if complete else None)
    if markdown is not None:
        write_markdown(markdown, engine, markdown_section(report, engine))
        console.print(f"results written to {markdown} (section {engine})")
    return 0


def run(args: argparse.Namespace, argv: list[str], console: Console) -> tuple[Report, str]:
    plan = QUICK if args.quick else FULL
    # The caller's KUMIKO_QUEUE_PREFIX may name a live deployment whose keys the clean-up would
    # delete, so the bench never takes it; it picks its own and refuses one already in use.
    prefix = check_prefix(args.prefix or os.environ.get("KUMIKO_BENCH_PREFIX") or new_prefix())
    redis_url = os.environ.get("KUMIKO_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise BenchError(
            f"Redis at {redis_url} does not answer ({exc}); start it or set KUMIKO_REDIS_URL"
        ) from exc
    if own_keys(client, prefix):
        raise BenchError(f"keys matching *{prefix}* already exist in Redis: pick another --prefix")
    db = args.db or os.environ.get("DATABASE_URL")
    command = " ".join(["python -m bench", *argv])
    if db and not args.db:
        command = f"DATABASE_URL={_redacted(db)} {command}"
    with bench_database(db) as (database_url, label):
        env = BenchEnv(prefix, redis_url, database_url, label, client)
        django_ready = False
        try:
            setup_django(env)
            django_ready = True
            report = Report(facts=machine_facts(env), command=command)
            measure(env, plan, args, report, console)
            report.facts["load average at end"] = load_average()
        finally:
            env.stop_children()
            delete_own_keys(client, prefix)
            if django_ready:
                _forget_database(prefix)
    from django.db import connection

    return report, connection.vendor


def _paired(label: str, a: Rate, b: Rate, target: float, report: Report) -> Ratio:
    """The median of the round-by-round ratios; their range goes to the notes."""
    ratios = sorted(paired_ratios(a, b))
    report.notes.append(
        f"{label}: the median of {len(ratios)} paired rounds (each pair back to back, the order "
        f"alternating); the pairs ranged {ratios[0]:.2f}..{ratios[-1]:.2f}."
    )
    return Ratio(label, statistics.median(ratios), target)


def measure(env: BenchEnv, plan: Plan, args: argparse.Namespace, report: Report, console: Console) -> None:
    sections = args.only or SECTIONS
    if "peers" in sections:
        from bench.peer_rates import peer_versions

        # Before any other section runs: a missing install fails at once, not minutes later.
        report.facts["dramatiq / celery / kombu"] = peer_versions()
    if "dispatch" in sections:
        from bench.dispatch_rate import measure_dispatch

        console.log(f"dispatch() vs Queue.enqueue: {plan.enqueue_rounds} x {plan.dispatch} jobs each")
        ours, raw = measure_dispatch(env, plan.dispatch, plan.enqueue_rounds)
        report.rates += [ours, raw]
        report.ratios.append(_paired("dispatch() / rq Queue.enqueue", ours, raw, 1.0, report))
    if "tasks" in sections:
        from bench.tasks import measure_tasks

        console.log(f"Task.enqueue() vs dispatch(): {plan.enqueue_rounds} x {plan.dispatch} each")
        enqueued, dispatched = measure_tasks(env, plan.dispatch, plan.enqueue_rounds)
        report.rates += [enqueued, dispatched]
        report.ratios.append(_paired("Task.enqueue() / dispatch()", enqueued, dispatched, 0.9, report))
    if "workers" in sections:
        measure_worker_section(env, plan, args, report, console)
    if "commands" in sections:
        from bench.command_counts import measure_commands

        console.log(f"Redis commands per job: {plan.commands} jobs each side")
        counts, where = measure_commands(env, plan.commands)
        report.commands += counts
        report.notes.append(
            f"Commands counted on a {where}; totals include the commands Lua scripts run. runjobs per "
            "executed job = (the count of its run on the queued jobs - that of a run on the empty lane) "
            "/ jobs; the 'incl. start-up' row and the RQ SimpleWorker row spread start-up and shutdown "
            "over the jobs."
        )
    if "tenancy" in sections:
        from bench.tenancy import measure_tenancy

        report.tenancy += measure_tenancy(env, plan.tenancy, console)
        report.notes.append(
            "Tenancy: backlogs pushed with prepare()+push() in pipelined batches (rows inserted first); "
            "the measured runs go through dispatch() (fan-out: run_fan_out). Latency = the run's "
            "started_at in its run record (the claim) minus the moment dispatch() was called. Worker "
            "rates from the run records, one set each per round."
        )
    if "console" in sections:
        from bench.console import measure_console

        report.console += measure_console(env, plan.console_rows, plan.console_renders, console)
        report.notes.append(
            "Console: admin pages rendered by Django's test client as an operator (view, template, "
            "middleware; no network) on generated run rows and a day of Redis counters (bench/console.py)."
        )
    if "observability" in sections:
        from bench.observability import measure_observability

        rounds = plan.observability_rounds
        console.log(f"observability: {rounds} rounds of runjobs x {plan.worker}, with and without the SDK")
        rates, ratios, note = measure_observability(env, plan.worker, rounds)
        report.rates += rates
        report.ratios += ratios
        report.notes.append(note)
    if "peers" in sections:
        from bench.peer_rates import measure_peers

        rates, ratios, note = measure_peers(env, plan.peers, console)
        report.rates += rates
        report.ratios += ratios
        report.notes.append(note)
    if "schedules" in sections:
        from bench.schedules import measure_schedules

        report.schedules += measure_schedules(env, plan.schedules, console)
        report.notes.append(
            'Schedules: the leader\'s planner step for one tick of a tz="tenant" per-tenant schedule '
            "(bench/schedules.py), injected clock, real Redis and database."
        )


def measure_worker_section(
    env: BenchEnv, plan: Plan, args: argparse.Namespace, report: Report, console: Console
) -> None:
    from bench.worker_rate import measure_processes, measure_workers, run_ours

    console.log(
        f"workers: {plan.rounds} rounds of runjobs and SimpleWorker x {plan.worker}, "
        f"forking Worker x {plan.fork}"
    )
    workers = measure_workers(env, plan.worker, plan.fork, plan.rounds)
    console.log(f"workers: {plan.process_rounds} rounds of runjobs --processes 1 and 2 x {plan.processes}")
    one, two = measure_processes(env, plan.processes, plan.process_rounds)
    report.rates += [workers.ours, workers.simple, workers.fork, one, two]
    report.ratios += [
        Ratio("runjobs / rq SimpleWorker", workers.ours.per_second / workers.simple.per_second, 3.0),
        Ratio("runjobs / rq Worker (fork)", workers.ours.per_second / workers.fork.per_second, 8.0),
        Ratio("runjobs --processes 2 / --processes 1", two.per_second / one.per_second, 1.5),
        Ratio(
            f"runjobs (1 thread) db connections opened over {plan.worker:,} jobs",
            workers.connections,
            2,
            at_most=True,
            fmt="d",
        ),
    ]
    report.notes.append(
        "Worker rates: jobs / (last end - first start), kumiko's from its run records (started_at, "
        "finished_at), RQ's from its job hashes (started_at, ended_at), so interpreter start-up and "
        "worker registration are excluded; child wall time shown beside, and the most database "
        "connections a runjobs process opened in a round (its shutdown line). --processes: the "
        f"supervisor and its children on {plan.processes:,} runs of one tenant pushed beforehand, "
        "each child exiting when the lane is empty (--burst); the rate is that of the span in "
        "which all of a round's worker processes worked (the last one's first claim to the first "
        "one's last finish, the runs claimed and finished in it), the whole round for one. "
        "Machine busy and CPU a job: /proc/stat over that span, every process on the machine "
        "(PostgreSQL and Redis share the cores with the workers); the rate the cores allow is "
        "all of them at two processes' CPU a job, the most --processes 2 could reach here."
    )
    if args.profile is not None:
        from bench.profiling import summarise

        console.log(f"profiling runjobs on {plan.worker} jobs (an extra run, not in the table)")
        run_ours(env, plan.worker, "profile", args.profile)
        console.print(summarise(args.profile, plan.worker))


def _forget_database(prefix: str) -> None:
    from django.db import connections

    delete_own_rows(prefix)
    # Before the temporary SQLite file is removed (and so PostgreSQL sees no idle session).
    connections.close_all()


def _redacted(url: str) -> str:
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
