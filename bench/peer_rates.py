"""Peers: runjobs against Dramatiq and Celery on the same jobs, RQ's SimpleWorker for reference.

Two kinds of job, the same bodies on every system (bench/peers/stamps.py): trivial (nothing)
and 20 ms of I/O (``time.sleep(0.02)``). Per round and kind, each system gets its queue filled
first, then one worker child:

- runjobs: ``manage.py runjobs --lane worker --burst -v 0 --processes 1 --threads 8``;
- Dramatiq: ``python -m dramatiq bench.peers.dramatiq_tasks --processes 1 --threads 8``;
- Celery: ``python -m celery -A bench.peers.celery_app worker --pool=threads --concurrency=8``;
- rq SimpleWorker (20 ms jobs only): bench/rqworker.py, burst.

The rate is jobs / (last end - first start) over the stamps the jobs push themselves (one RPUSH
each, on every side alike), so start-up and shutdown are left out on every side; runjobs' run
records and SimpleWorker's job hashes give the same span as a cross-check. runjobs and
SimpleWorker exit by themselves (burst); Dramatiq and Celery have no burst mode, so the bench
waits (BLPOP) for the last job's stamp and then stops them with SIGTERM.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from rich.console import Console

from bench.children import Child, running
from bench.environment import BenchEnv, BenchError
from bench.peers import stamps
from bench.results import Rate, Ratio
from bench.worker_rate import run_ours, run_rq

THREADS = 8
KINDS = {"trivial": "trivial", "io20": "20 ms"}  # kind -> label
TASKS: dict[str, Callable[[str, int, int], None]] = {"trivial": stamps.trivial, "io20": stamps.io20}
DRAMATIQ = ("-m", "dramatiq", "bench.peers.dramatiq_tasks", "--processes", "1", "--threads", str(THREADS))
DRAMATIQ_LABEL = f"Dramatiq 1x{THREADS}"
CELERY_LABEL = f"Celery threads {THREADS}"
# runjobs as the peers run: 1 process x 8 threads.
RUNJOBS_ARGS = ("--processes", "1", "--threads", str(THREADS))
RUNJOBS_NAME = f"runjobs 1x{THREADS}"  # in ratio labels
RUNJOBS_LABEL = f"{RUNJOBS_NAME} (--processes 1 --threads {THREADS})"  # in rate labels
IO20_TARGET = 360.0  # jobs/s of 20 ms jobs on 8 threads: 90 % of the ideal 400


@dataclass(frozen=True)
class PeerSizes:
    trivial: int
    io20: int  # per side with 8 threads
    io20_serial: int  # per side running one job at a time: ~47 jobs/s whatever the count
    rounds: int


FULL = PeerSizes(trivial=2000, io20=1000, io20_serial=150, rounds=3)
QUICK = PeerSizes(trivial=80, io20=64, io20_serial=16, rounds=1)


@dataclass(frozen=True)
class PeerRound:
    busy: float  # first start to last end over the jobs' stamps
    wall: float  # child process start to exit
    recorded: float | None = None  # the same span from runjobs' run records or RQ's job hashes
    connections: tuple[int, ...] = ()  # database connections the runjobs process opened


def peer_versions() -> str:
    """``dramatiq / celery / kombu`` versions; a clear error where bench/requirements-peers.txt is missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return " / ".join(version(name) for name in ("dramatiq", "celery", "kombu"))
    except PackageNotFoundError as exc:
        raise BenchError(
            f"the peers section needs {exc.name}: `make bench` installs bench/requirements-peers.txt, "
            "or run `.venv/bin/python -m pip install -r requirements.txt -r bench/requirements-peers.txt` "
            "(or run other sections only, e.g. --only workers)"
        ) from None


def stamp_seconds(client: redis.Redis, key: str, count: int) -> float:
    """First start to last end over the stamps; every job must have stamped exactly once."""
    rows = [(raw if isinstance(raw, str) else raw.decode()).split() for raw in client.lrange(key, 0, -1)]
    distinct = {row[0] for row in rows}
    if len(rows) != count or len(distinct) != count:
        raise BenchError(
            f"{key}: {len(rows)} stamps from {len(distinct)} distinct jobs, expected {count} "
            "(a job never ran, or ran twice)"
        )
    return max(float(row[2]) for row in rows) - min(float(row[1]) for row in rows)


def stamp_cost(prefix: str, calls: int = 200) -> float:
    """Median seconds of one stamp (the RPUSH every job pays), timed in the bench process."""
    key = f"{prefix}:peers:stamp_cost"
    times: list[float] = []
    for i in range(calls):
        started = time.perf_counter()
        stamps.record(key, -1, i, time.time())
        times.append(time.perf_counter() - started)
    stamps.redis_client().delete(key)
    return statistics.median(times)


def _key(env: BenchEnv, side: str, kind: str, tag: str) -> str:
    return f"{env.prefix}:peers:{side}:{kind}:{tag}"


def run_runjobs(env: BenchEnv, kind: str, count: int, tag: str) -> PeerRound:
    key = _key(env, "runjobs", kind, tag)
    result = run_ours(
        env,
        count,
        f"peers_{kind}_{tag}",
        job=f"bench.{kind}",
        payload={"stamps": key, "expected": count},
        extra_args=RUNJOBS_ARGS,
    )
    return PeerRound(stamp_seconds(env.client, key, count), result.wall, result.busy, result.connections)


def run_simple(env: BenchEnv, kind: str, count: int, tag: str) -> PeerRound:
    key = _key(env, "rq", kind, tag)
    result = run_rq(env, count, "simple", f"peers_{kind}_{tag}", TASKS[kind], key, count)
    return PeerRound(stamp_seconds(env.client, key, count), result.wall, result.busy)


def run_dramatiq(env: BenchEnv, kind: str, count: int, tag: str) -> PeerRound:
    from bench.peers.dramatiq_tasks import ACTORS

    key = _key(env, "dramatiq", kind, tag)
    actor = ACTORS[kind]
    for i in range(count):
        actor.send(key, count, i)
    return _serve_until_done(env, DRAMATIQ, key, count)


def run_celery(env: BenchEnv, kind: str, count: int, tag: str) -> PeerRound:
    from bench.peers.celery_app import QUEUE, TASKS

    key = _key(env, "celery", kind, tag)
    task = TASKS[kind]
    for i in range(count):
        task.apply_async((key, count, i))
    argv = (
        *("-m", "celery", "-A", "bench.peers.celery_app", "worker", "--pool=threads"),
        *(f"--concurrency={THREADS}", "--loglevel=WARNING", "-Q", QUEUE, "-n", f"{QUEUE}@%h"),
        # Cluster chatter a single worker does not need (and keys outside the queue's).
        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
    )
    return _serve_until_done(env, argv, key, count)


def _serve_until_done(env: BenchEnv, argv: Sequence[str], key: str, count: int) -> PeerRound:
    """Start a worker with no burst mode, wait for the last job's stamp, stop it (SIGTERM)."""
    started = time.perf_counter()
    with running(env, argv) as worker:
        _wait_done(env.client, key, count, worker, timeout=60 + count / 20)
    wall = time.perf_counter() - started
    return PeerRound(stamp_seconds(env.client, key, count), wall)


def _wait_done(client: redis.Redis, key: str, count: int, worker: Child, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not client.blpop([stamps.done_key(key)], timeout=1):
        worker.check()
        if time.monotonic() > deadline:
            raise BenchError(
                f"waited {timeout:.0f}s for {count} jobs, {client.llen(key)} stamped; "
                f"{' '.join(worker.argv)} said:\n{worker.tail()}"
            )


Runner = Callable[[str], PeerRound]  # round tag -> its result


def measure_peers(env: BenchEnv, sizes: PeerSizes, console: Console) -> tuple[list[Rate], list[Ratio], str]:
    """Rounds rotate the order of the sides within each kind; each rate is the median round's."""
    console.log(
        f"peers: {sizes.rounds} rounds of {sizes.trivial} trivial jobs and {sizes.io20} 20 ms jobs "
        f"({sizes.io20_serial} for SimpleWorker) per side"
    )
    sides: dict[str, list[tuple[Rate, Runner]]] = {}
    for kind, kind_label in KINDS.items():
        count = sizes.trivial if kind == "trivial" else sizes.io20
        sides[kind] = [
            (Rate(f"{kind_label}: {RUNJOBS_LABEL}", count), _bind(run_runjobs, env, kind, count)),
            (Rate(f"{kind_label}: {DRAMATIQ_LABEL}", count), _bind(run_dramatiq, env, kind, count)),
            (Rate(f"{kind_label}: {CELERY_LABEL}", count), _bind(run_celery, env, kind, count)),
        ]
    sides["io20"].append(
        (
            Rate("20 ms: rq SimpleWorker", sizes.io20_serial),
            _bind(run_simple, env, "io20", sizes.io20_serial),
        )
    )
    results: dict[str, list[PeerRound]] = {}
    for number in range(sizes.rounds):
        for kind_sides in sides.values():
            shift = number % len(kind_sides)
            for rate, run in kind_sides[shift:] + kind_sides[:shift]:
                result = run(f"r{number}")
                rate.seconds.append(result.busy)
                results.setdefault(rate.label, []).append(result)
    for kind_sides in sides.values():
        for rate, _ in kind_sides:
            rate.note = _note(results[rate.label], rate.jobs)
    rates = {kind: [rate for rate, _ in kind_sides] for kind, kind_sides in sides.items()}
    (trivial_ours, trivial_dramatiq, trivial_celery) = rates["trivial"]
    (io_ours, io_dramatiq, io_celery, io_simple) = rates["io20"]
    ratios = [
        Ratio(f"trivial: {RUNJOBS_NAME} / {DRAMATIQ_LABEL}", _ratio(trivial_ours, trivial_dramatiq), 1.0),
        Ratio(f"trivial: {RUNJOBS_NAME} / {CELERY_LABEL}", _ratio(trivial_ours, trivial_celery), 1.0),
        Ratio(f"20 ms: {RUNJOBS_NAME} jobs/s", io_ours.per_second, IO20_TARGET),
        Ratio(f"20 ms: {RUNJOBS_NAME} / {DRAMATIQ_LABEL}", _ratio(io_ours, io_dramatiq), 1.0),
        Ratio(f"20 ms: {RUNJOBS_NAME} / {CELERY_LABEL}", _ratio(io_ours, io_celery), None),
        Ratio(f"20 ms: {RUNJOBS_NAME} / rq SimpleWorker", _ratio(io_ours, io_simple), None),
    ]
    cost_us = stamp_cost(env.prefix) * 1e6
    note = (
        "Peers: each queue filled first, then one worker child; rate = jobs / (last end - first start) "
        f"over stamps the jobs push themselves, one RPUSH each on every side (~{cost_us:.0f} us a call "
        "here); Dramatiq and Celery stopped (SIGTERM) once the last stamp is in; 'records' = the same "
        "span from runjobs' run records (started_at/finished_at), 'hashes' from SimpleWorker's job "
        "hashes (started_at/ended_at)."
    )
    return [rate for kind_rates in rates.values() for rate in kind_rates], ratios, note


def _bind(run: Callable[..., PeerRound], *args: object) -> Runner:
    return lambda tag: run(*args, tag)


def _ratio(ours: Rate, other: Rate) -> float:
    return ours.per_second / other.per_second


def _note(rounds: list[PeerRound], jobs: int) -> str:
    wall = statistics.median(r.wall for r in rounds)
    recorded = [r.recorded for r in rounds if r.recorded is not None]
    if not recorded:  # a worker the bench stopped
        return f"child wall {wall:.1f}s incl. start-up and stop"
    source = "records" if rounds[0].connections else "hashes"
    text = f"child wall {wall:.1f}s incl. start-up; {source} {jobs / statistics.median(recorded):,.0f}/s"
    opened = [n for r in rounds for n in r.connections]
    return f"{text}; <= {max(opened)} db connections" if opened else text
