"""Job timeouts (SIGALRM) leave an outer interval timer, such as pytest-timeout's, working."""

from __future__ import annotations

import signal
import time
from types import FrameType

import pytest

from kumiko_jobs.exceptions import JobTimeout
from kumiko_jobs.timeouts import enforce_timeout


class OuterTimer:
    def __init__(self, seconds: float) -> None:
        self.fired = 0
        self.previous = signal.signal(signal.SIGALRM, self.handler)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.fired += 1

    def close(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


@pytest.fixture
def outer() -> OuterTimer:
    # pytest-timeout (signal method) arms the same timer around each test: keep it out of the way.
    saved = signal.getitimer(signal.ITIMER_REAL)
    timer = OuterTimer(0.3)
    yield timer
    timer.close()
    signal.setitimer(signal.ITIMER_REAL, *saved)


def test_job_timeout_stops_the_handler() -> None:
    with pytest.raises(JobTimeout, match=r"exceeded its timeout of 0\.05s"):
        with enforce_timeout(0.05, "t.job"):
            time.sleep(1)


def test_outer_timer_is_rearmed_after_a_short_job(outer: OuterTimer) -> None:
    with enforce_timeout(5, "t.job"):
        time.sleep(0.01)
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < remaining <= 0.3
    time.sleep(0.4)
    assert outer.fired == 1


def test_outer_timer_due_during_the_job_fires_and_the_job_timeout_still_holds(outer: OuterTimer) -> None:
    with pytest.raises(JobTimeout):
        with enforce_timeout(0.6, "t.job"):
            time.sleep(0.45)
            assert outer.fired == 1  # the outer deadline (0.3 s) passed inside the job
            time.sleep(1)
    assert outer.fired == 1


def _busy_until(deadline: float) -> None:
    while time.monotonic() < deadline:  # Python bytecode: an asynchronous exception lands here
        pass


def test_watchdog_stops_a_job_thread_whose_deadline_comes_before_the_others() -> None:
    import threading

    from kumiko_jobs.timeouts import Watchdog

    watchdog = Watchdog()
    watchdog.start()
    release = threading.Event()

    def long_job() -> None:
        with watchdog.watch(30, "long"):
            release.wait(10)

    other = threading.Thread(target=long_job)
    other.start()
    time.sleep(0.05)  # the watchdog now sleeps until the long job's deadline, 30 s away
    started = time.monotonic()
    with pytest.raises(JobTimeout), watchdog.watch(0.2, "short"):
        _busy_until(started + 5)
    assert 0.2 <= time.monotonic() - started < 1.5
    release.set()
    other.join()


def test_watchdog_is_not_woken_by_jobs_due_after_its_next_deadline() -> None:
    from kumiko_jobs.timeouts import Watchdog

    watchdog = Watchdog()
    looked_at: list[str] = []
    due = watchdog._due

    def counting_due(ident: int, entry: object, now: float) -> float | None:
        looked_at.append(getattr(entry, "job_name", ""))
        return due(ident, entry, now)  # type: ignore[arg-type]

    watchdog._due = counting_due  # type: ignore[method-assign]
    watchdog.start()
    with watchdog.watch(20, "first"):
        time.sleep(0.05)  # woken once: the first deadline
        for _ in range(200):  # each due after "first": none wakes the watchdog
            with watchdog.watch(30, "quick"):
                time.sleep(0)
        time.sleep(0.05)
    assert looked_at == ["first"]


def test_a_handler_that_swallows_its_timeout_gets_it_again() -> None:
    """A loop that catches Exception, logs and goes on swallowed the one JobTimeout of a
    main-thread worker, and ran on without a limit."""
    caught = 0
    with pytest.raises(JobTimeout), enforce_timeout(0.2, "tests.swallower"):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except JobTimeout:
                caught += 1
                if caught == 2:
                    raise
    assert caught == 2


def test_a_watch_ended_late_leaves_a_later_jobs_watch_in_place() -> None:
    """A watch's generator kept alive by a stored traceback is finalized after the thread's next
    job started its own: it removed that job's watch by thread, and its timeout never fired."""
    import threading

    from kumiko_jobs.timeouts import Watchdog

    dog = Watchdog()  # not started: only its bookkeeping is under test
    first = dog.watch(60, "tests.first")
    first.__enter__()
    later = dog.watch(60, "tests.later")
    later.__enter__()
    first.__exit__(None, None, None)  # the first job's watch, finalized late
    assert dog._watches[threading.get_ident()].job_name == "tests.later"
    later.__exit__(None, None, None)
    assert threading.get_ident() not in dog._watches
