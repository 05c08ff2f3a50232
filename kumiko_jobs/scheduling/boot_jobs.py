"""run_on_boot: dispatch a lane's boot jobs once per Redis dataset, QUEUE_PREFIX and RELEASE.

A hash of "<release>|<job>" markers under the prefix records what was dispatched. The check of
the markers, the push and the marker writes are one Redis transaction (WATCH on the hash), so
processes starting together dispatch each boot job once, and a crash can leave neither a marker
without its job nor a job without its marker. Restarts find the markers and dispatch nothing; a
new RELEASE has no markers yet; a fresh Redis (a new dataset) has none at all.
"""

from __future__ import annotations

import logging
import time

from redis.client import Pipeline

from kumiko_jobs import guarded_writes
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.dispatching import DispatchResult, record_pushes
from kumiko_jobs.preparing import prepare
from kumiko_jobs.pushing import PreparedJob, Pushed, Selection, push_watched
from kumiko_jobs.registry import registry

logger = logging.getLogger("kumiko_jobs")
TRIGGER_NAME = "boot"


def boot_mark(release: str, job_name: str) -> str:
    return f"{release}|{job_name}"


def dispatch_boot_jobs(lane: str) -> list[DispatchResult]:
    """Dispatch the lane's run_on_boot jobs not dispatched yet for this dataset and release."""
    definitions = [d for d in registry.all() if d.lane == lane and d.run_on_boot]
    if not definitions:
        return []
    keys, client = get_keys(), get_redis()
    release = str(get_config()["RELEASE"])
    marks = [boot_mark(release, d.name) for d in definitions]
    prepared = {
        mark: prepare(d, {}, tenant_id=None, user_id=None, trigger_name=TRIGGER_NAME)
        for mark, d in zip(marks, definitions, strict=True)
    }

    def select(pipe: Pipeline) -> Selection:
        done = pipe.hmget(keys.boot_marks, marks)
        return [prepared[mark] for mark, value in zip(marks, done, strict=True) if value is None]

    def mark_dispatched(pipe: Pipeline, chosen: Selection) -> None:
        if chosen:
            mark_of = {id(p): mark for mark, p in prepared.items()}
            pipe.hset(keys.boot_marks, mapping={mark_of[id(p)]: time.time() for p in chosen})

    result = push_watched(watch=keys.boot_marks, select=select, also=mark_dispatched, client=client)
    chosen, outcomes = result if result is not None else ([], [])
    if chosen:
        guarded_writes.safe(record_pushes, chosen, outcomes, rows_exist=False)
        logger.info(
            "kumiko_jobs: dispatched boot job(s) %s (release %r)",
            ", ".join(p.row.job_name for p in chosen),
            release,
        )
    return [_result(p, o) for p, o in zip(chosen, outcomes, strict=True)]


def _result(p: PreparedJob, pushed: Pushed) -> DispatchResult:
    if pushed.status == "skipped":
        return DispatchResult(p.row.job_name, "skipped", reason=pushed.reason)
    return DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id))
