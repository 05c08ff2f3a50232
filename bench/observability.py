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

Rounds alternate the order of the two sides; each rate is the median round's. The hook cost
without an SDK is timed in this process (no SDK here) over the calls a worker makes per attempt,
and compared with the time one job takes at the measured no-SDK rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.environment import BenchEnv
from bench.results import Rate, Ratio
from bench.worker_rate import Round, run_ours

SDK_ENV = {"KUMIKO_BENCH_OTEL": "sdk"}
EXPORT_ENV = {"KUMIKO_BENCH_OTEL": "export"}
HOOK_CALLS = 20_000


def measure_observability(env: BenchEnv, count: int, rounds: int) -> tuple[list[Rate], list[Ratio], str]:
    plain = Rate("runjobs, no OpenTelemetry SDK", count, note="API only (proxy providers)")
    sdk = Rate("runjobs, SDK without exporter", count, note="recording spans, nothing exported")
    export = Rate("runjobs, SDK exporting", count, note="batched spans dropped, metrics aggregated")
    sides: list[tuple[Rate, Callable[[str], Round]]] = [
        (plain, lambda tag: run_ours(env, count, f"obs_plain_{tag}")),
        (sdk, lambda tag: run_ours(env, count, f"obs_sdk_{tag}", child_env=SDK_ENV)),
        (export, lambda tag: run_ours(env, count, f"obs_export_{tag}", child_env=EXPORT_ENV)),
    ]
    for number in range(rounds):
        shift = number % len(sides)
        for rate, run in sides[shift:] + sides[:shift]:
            rate.seconds.append(run(f"r{number}").busy)
    hook_us = hook_microseconds()
    job_us = 1e6 / plain.per_second
    ratios = [
        Ratio("runjobs with SDK (no exporter) / without", sdk.per_second / plain.per_second, 0.90),
        Ratio("runjobs with SDK exporting / without", export.per_second / plain.per_second, None),
        Ratio("job time left by the no-SDK hooks (1 - hooks / job)", 1 - hook_us / job_us, 0.99),
    ]
    note = (
        f"Observability: without an SDK the per-attempt hooks (process span check, outcome, duration, "
        f"last success) take {hook_us:.2f} µs, against {job_us:.0f} µs per trivial job at the no-SDK "
        "rate. With the SDK every attempt records a process span; exporting adds the batch processor's "
        "queue and the metric aggregation. The Redis side (the queued count, two INCRBY inside the "
        "lane scripts per job, no round trip) is in every row."
    )
    return [plain, sdk, export], ratios, note


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
