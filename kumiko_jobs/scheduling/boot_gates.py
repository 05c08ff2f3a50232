"""Boot gates: a lane's ``boot_gate=True`` jobs, run inline by every runjobs of the lane before
it takes any job (migrations checks, warm-ups, "is the schema what this code expects").

Each gate runs through the normal execution path (record, span, tenant activation, timeout)
with a JobRun of ``trigger_name="boot_gate"``, in declaration order, in the main thread (so its
``timeout`` is enforced like any job's). Declared retries are honoured, inline, with the job's
backoff. A gate that fails finally or times out raises BootGateFailed and the worker does not
start; one without a timeout that runs longer than BOOT_GATE_WARN_AFTER logs a warning naming
it. ``ctx.defer()`` raises DeferralError: there is no queued run to defer.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kumiko_jobs import attempt_records, guarded_writes
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.context import JobContext
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.exceptions import BootGateFailed, text_of
from kumiko_jobs.execution import RecordStartAtOnce, execute
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.run_ids import new_run_id

logger = logging.getLogger("kumiko_jobs")
TRIGGER_NAME = "boot_gate"


def lane_gates(lane: str) -> list[JobDefinition]:
    return [d for d in registry.all() if d.lane == lane and d.boot_gate]


def run_boot_gates(lane: str, *, worker: str) -> int:
    """Run the lane's gates in declaration order; raise BootGateFailed at the first failure."""
    gates = lane_gates(lane)
    for definition in gates:
        run_gate(definition, worker=worker)
    return len(gates)


def run_gate(definition: JobDefinition, *, worker: str) -> None:
    run_id = new_run_id()
    meta = JobMeta(
        run_id=str(run_id),
        job_name=definition.name,
        lane=definition.lane,
        trigger_name=TRIGGER_NAME,
        correlation_id=run_id.hex,
        max_attempts=definition.max_attempts,
    )
    job_id = f"{get_keys().id_tag}-gate-{run_id.hex}"
    failure: list[BaseException] = []
    gate = dataclasses.replace(definition, func=_remembering(definition.func, failure))
    watchdog = _slow_gate_warning(definition)
    try:
        while True:
            failure.clear()
            start = attempt_records.Started(job_id=job_id, payload={}, worker=worker, at=datetime.now(UTC))
            observer = RecordStartAtOnce()
            observer.started(meta, start)
            outcome = execute(
                gate,
                job_id,
                meta,
                {},
                consumer_lane=definition.lane,
                start=start,
                observer=observer,
                inline=True,
            )
            if outcome.kind == "ok":
                return
            if outcome.kind in ("retry", "requeue"):
                time.sleep(max(0.0, outcome.retry_at - time.time()))
                meta = JobMeta.from_json(outcome.meta) if outcome.meta else meta
                continue
            error = failure[0] if failure else None
            reason = f"{error.__class__.__name__}: {text_of(error)}" if error else "see its run record"
            raise BootGateFailed(definition.name, reason)
    except (KeyboardInterrupt, SystemExit):
        # Stopped while its gate ran (SIGTERM, Ctrl-C): the record says so, instead of running.
        guarded_writes.safe(_mark_stopped, run_id)
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()


def _mark_stopped(run_id: uuid.UUID) -> None:
    now = datetime.now(UTC)
    JobRun.objects.filter(pk=run_id, status__in=ACTIVE_STATUSES).update(
        status=RunStatus.FAILED,
        finished_at=now,
        updated_at=now,
        error="The worker stopped during its boot gate.",
    )


def _remembering(
    func: Callable[[dict[str, Any], JobContext], Any], failure: list[BaseException]
) -> Callable[[dict[str, Any], JobContext], Any]:
    """The handler, keeping what it raised so the exit message can say why the gate failed. An
    ``async def`` one stays a coroutine function: a plain wrapper made the worker call it on the
    sync path, which only created the coroutine, so the gate never ran and always passed."""
    if inspect.iscoroutinefunction(func):

        async def async_gate(payload: dict[str, Any], ctx: JobContext) -> Any:
            try:
                return await func(payload, ctx)
            except BaseException as exc:
                failure.append(exc)
                raise

        return async_gate

    def gate(payload: dict[str, Any], ctx: JobContext) -> Any:
        try:
            return func(payload, ctx)
        except BaseException as exc:
            failure.append(exc)
            raise

    return gate


def _slow_gate_warning(definition: JobDefinition) -> threading.Timer | None:
    if definition.timeout is not None:
        return None  # enforced instead
    after = float(get_config()["BOOT_GATE_WARN_AFTER"])
    timer = threading.Timer(
        after,
        logger.warning,
        (
            "kumiko_jobs: boot gate %s is still running after %gs; the worker takes no job until it "
            "finishes. Give it a timeout to make a hanging gate fail the start-up instead.",
            definition.name,
            after,
        ),
    )
    timer.daemon = True
    timer.start()
    return timer
