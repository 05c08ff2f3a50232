"""Support of the chaos suite (test_chaos.py): real workers, real kills, a real Redis restart.

Workers run with a short lease (ABANDON_AFTER 4 s, heartbeat 1 s) so recovery is quick; every
execution of ``tests.chaos_work`` appends a line to a ledger file (Redis is what gets wiped).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import wait_until

ABANDON_AFTER = 4.0
CHAOS_ENV = {"KUMIKO_TEST_ABANDON_AFTER": str(ABANDON_AFTER), "KUMIKO_TEST_HEARTBEAT_INTERVAL": "1"}


@dataclass
class Ledger:
    path: Path

    def lines(self) -> list[tuple[str, str, int, int, float]]:
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_text().splitlines():
            event, run_id, attempt, pid, at = raw.split()
            out.append((event, run_id, int(attempt), int(pid), float(at)))
        return out

    def executions(self) -> Counter[str]:
        return Counter(run_id for event, run_id, *_ in self.lines() if event == "start")


# pytest's record_property fixture: (name, value) kept with the test's report.
RecordProperty = Callable[[str, object], None]


@dataclass
class Figures:
    """What a chaos test measured; printed as one JSON line and checked by the test."""

    scenario: str
    accepted: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong_final: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self, record_property: RecordProperty) -> None:
        """Kept with the test's report, which the suite's summary prints (tests/conftest.py):
        also from pytest-xdist's worker processes, whose own output is not shown."""
        record_property("chaos", json.dumps(self.__dict__, sort_keys=True))


def settle(run_ids: list[str], timeout: float) -> list[JobRun]:
    """Wait until every run is finished; returns the runs."""

    def finished() -> list[JobRun] | None:
        runs = list(JobRun.objects.filter(pk__in=run_ids))
        done = [r for r in runs if r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.DROPPED)]
        return runs if len(done) == len(run_ids) else None

    found: list[JobRun] = wait_until(finished, timeout, f"{len(run_ids)} runs to finish", step=0.25)
    return found


def figures_of(scenario: str, run_ids: list[str], ledger: Ledger, timeout: float) -> Figures:
    try:
        runs = settle(run_ids, timeout)
    except AssertionError:
        runs = list(JobRun.objects.filter(pk__in=run_ids))
    executions = ledger.executions()
    by_id = {str(r.pk): r for r in runs}
    lost = [i for i in run_ids if i not in by_id or by_id[i].status != RunStatus.SUCCEEDED]
    wrong = [i for i, r in by_id.items() if r.status == RunStatus.SUCCEEDED and executions[i] == 0]
    return Figures(
        scenario,
        accepted=len(run_ids),
        lost=len(lost),
        duplicated=sum(max(executions[i] - 1, 0) for i in run_ids),
        wrong_final=len(wrong),
        extra={"unfinished_sample": lost[:5]},
    )
