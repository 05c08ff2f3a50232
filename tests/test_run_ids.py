"""Run ids: version 7 UUIDs that order by the time they were made."""

from __future__ import annotations

import time
import uuid

from kumiko_jobs.run_ids import new_run_id


def test_a_run_id_is_a_version_7_uuid_of_the_current_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    run_id = new_run_id()
    after = time.time_ns() // 1_000_000
    assert run_id.version == 7
    assert run_id.variant == uuid.RFC_4122
    assert before <= run_id.int >> 80 <= after
    # Parsed back from its text, as the job hash and the row carry it.
    assert uuid.UUID(str(run_id)) == run_id


def test_run_ids_order_by_time_and_do_not_repeat() -> None:
    first = [new_run_id() for _ in range(2_000)]
    time.sleep(0.002)
    later = [new_run_id() for _ in range(2_000)]
    assert len(set(first + later)) == 4_000
    assert max(first) < min(later)
    # The random bits vary (not only the clock): ids of one millisecond differ below it.
    assert len({run_id.int & ((1 << 62) - 1) for run_id in first}) == 2_000


def test_the_longest_job_ids_the_package_makes_fit_their_columns() -> None:
    """A 64-character prefix with ':' (its id tag gets a 7-character suffix), a tz="tenant" tick's
    wrapper and its child for a 40-character tenant id (longer ones are hashed to 20): before,
    100 characters was the limit and PostgreSQL refused the rows (SQLite stores any length and
    never said so)."""
    from kumiko_jobs.fanout import child_job_id
    from kumiko_jobs.keys import Keys
    from kumiko_jobs.models import JobRun
    from kumiko_jobs.scheduling.specs import zone_tick_job_id

    keys = Keys("p:" + "x" * 62)
    wrapper = zone_tick_job_id(keys, "j" * 200, 4_102_444_800.0, "America/Argentina/ComodRivadavia")
    child = child_job_id(wrapper, "t" * 40)
    plain = f"{keys.id_tag}-{'f' * 32}"
    widths = {
        name: JobRun._meta.get_field(name).max_length for name in ("job_id", "fanout_of", "fanout_parent")
    }
    assert (len(wrapper), len(child), len(plain)) == (106, 149, 104)
    assert all(len(child) <= width for width in widths.values() if width is not None), widths
