"""What tracing and metrics cost a worker: ``runjobs --burst`` on the same trivial jobs with and
without the OpenTelemetry SDK in the child, plus the per-job cost of the hooks without an SDK.

- "no SDK": the child has only the API (its proxy providers), as a project that installs no
  SDK; kumiko_jobs' hooks then do one ``isinstance`` per attempt and no-op metric calls.
- "SDK, no exporter": bench/settings.py installs the SDK's TracerProvider (no span processor)
  and MeterProvider (no reader), as ``OTEL_TRACES_EXPORTER=none`` would (env
  ``KUMIKO_BENCH_OTEL=sdk``): every attempt makes a recording process span, nothing is exported.
- "SDK, exporting": spans go through a BatchSpanProcessor to an exporter that drops them and a
  metric reader aggregates every measurement (``KUMIKO_BENCH_OTEL=export``): what exporting
  costs inside the worker, without a network. Shown for reference, no target.

Two measures per side. The rate (jobs over first start to last end, median round) is what the
other sections report, but on a shared 2-core machine a neighbour's load moves it by +-20%,
more than the effect measured here. The target is therefore taken on CPU time: the child's
user+system seconds (getrusage of waited children) for the jobs, minus those of the same child
started on an empty lane (interpreter, Django, SDK start-up), per job; rounds rotate the order
of the sides, the median round counts. The hook cost without an SDK is timed in this process
(which has no SDK) over the calls a worker makes per attempt.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.children import RUNJOBS
from bench.environment import BenchEnv
from bench.results import Rate, Ratio
from bench.worker_rate import run_ours

HOOK_CALLS = 20_000


def _over(part: float, whole: float) -> float:
    """part / whole; NaN when a side's CPU per job came out as 0 (with few jobs on a busy
    machine the idle start can cost as much CPU as the whole run: nothing left to divide by)."""
    return part / whole if whole > 0 else math.nan


@dataclass
class Side:
    tag: str
    rate: Rate
    env: Mapping[str, str]
    cpu_per_job: list[float] = field(default_factory=list)  # seconds

    def run(self, env: BenchEnv, count: int, number: int) -> None:
        """One round: ``count`` jobs, then an idle start of the same child."""
        cpu, measured = child_cpu(
            lambda: run_ours(env, count, f"obs_{self.tag}_{number}", child_env=self.env)
        )
        idle, _ = child_cpu(lambda: env.run_child(RUNJOBS, timeout=120, **self.env))
        self.rate.seconds.append(measured.busy)
        self.cpu_per_job.append(max(cpu - idle, 0.0) / count)

    @property
    def cpu_us(self) -> float:
        return statistics.median(self.cpu_per_job) * 1e6


def measure_observability(env: BenchEnv, count: int, rounds: int) -> tuple[list[Rate], list[Ratio], str]:
    sides = [
        Side("plain", Rate("runjobs, no OpenTelemetry SDK", count, note="API only"), {}),
        Side(
            "sdk",
            Rate("runjobs, SDK without exporter", count, note="spans recorded, none exported"),
            {"KUMIKO_BENCH_OTEL": "sdk"},
        ),
        Side(
            "export",
            Rate("runjobs, SDK exporting", count, note="spans batched and dropped, metrics aggregated"),
            {"KUMIKO_BENCH_OTEL": "export"},
        ),
    ]
    for number in range(rounds):
        shift = number % len(sides)
        for side in sides[shift:] + sides[:shift]:
            side.run(env, count, number)
    plain, sdk, export = sides
    for side in sides:
        side.rate.note += f"; CPU {side.cpu_us:.0f} µs/job"
    hook_us = hook_microseconds()
    ratios = [
        Ratio(
            "runjobs CPU per job: without SDK / with SDK (no exporter)", _over(plain.cpu_us, sdk.cpu_us), 0.90
        ),
        Ratio(
            "runjobs CPU per job: without SDK / with SDK exporting", _over(plain.cpu_us, export.cpu_us), None
        ),
        Ratio(
            "runjobs rate: with SDK (no exporter) / without, medians",
            sdk.rate.per_second / plain.rate.per_second,
            None,
        ),
        Ratio("job CPU left by the no-SDK hooks (1 - hooks / job)", 1 - _over(hook_us, plain.cpu_us), 0.99),
    ]
    note = (
        f"Observability: CPU per job {plain.cpu_us:.0f} µs without an SDK, {sdk.cpu_us:.0f} µs with "
        f"the SDK and no exporter, {export.cpu_us:.0f} µs exporting (child CPU minus an idle start of "
        "the same child; the rates beside them move with the machine's load). Without an SDK the "
        f"per-attempt hooks take {hook_us:.2f} µs. The Redis side of the depth metric (a queued count "
        "kept by the lane scripts: one INCRBY in the push script and one in the claim script, no "
        "round trip) is in every row."
    )
    return [side.rate for side in sides], ratios, note


def child_cpu[T](run: Callable[[], T]) -> tuple[float, T]:
    """User+system CPU seconds of the children ``run`` started and waited for, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result


def hook_microseconds(calls: int = HOOK_CALLS) -> float:
    """Microseconds per attempt that kumiko_jobs' telemetry hooks take in this process, which has
    no SDK (the bench never installs one in its own process)."""
    from kumiko_jobs import metrics, observability
    from kumiko_jobs.jobdata import JobMeta

    if observability.tracing_enabled():
        raise RuntimeError("the bench process has an SDK installed; hook costs would not be the no-SDK ones")
    meta = JobMeta(run_id="0" * 32, job_name="bench.noop", lane="worker", tenant_id="1")
    started = time.perf_counter()
    for _ in range(calls):
        with observability.processing(meta, "bench-job", "worker") as span:
            observability.record_outcome(span, "succeeded")
        metrics.attempt_ended("bench.noop", "succeeded", 0.001)
    return (time.perf_counter() - started) / calls * 1e6
