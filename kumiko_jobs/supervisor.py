"""``runjobs --processes P``: run P worker processes of a lane and keep them running.

Each child is ``runjobs`` with the same arguments (its own ``--threads``, ``--max-jobs``)
minus the supervisor's. A child that exits is replaced: at once after a clean exit (0, as after
a memory recycle or SIGHUP, EXIT_MAX_JOBS after its ``--max-jobs``, EXIT_RECYCLE when it asks
for its own replacement) or a late crash, with
backoff after a crash within STARTUP_WINDOW of its start; children that keep dying so make the
supervisor stop everything and exit 1, since a broken deploy must not spin. SIGTERM/SIGINT are
forwarded to every child (each finishes its running jobs); a second signal kills them. SIGHUP
replaces every child once its running jobs finish (a deploy's reload: the new children import
the code on disk now, so they run the lane's boot gates themselves). ``--max-memory MB``
recycles a child whose resident memory exceeds MB (SIGTERM: it finishes its jobs first).

The supervisor passes the lane's boot gates before it starts any child; the children that run
the code it imported itself skip them (GATES_PASSED_ENV, read by ``gates_passed_by_supervisor``).

Each child runs in a session of its own, so a terminal's Ctrl-C reaches it once, through the
supervisor, and not twice. A signal for the supervisor's process group therefore never reaches
the children either: a supervisor killed outright (the OOM killer, a process manager's SIGKILL)
forwards nothing. So each child watches its supervisor (``watch_supervisor``) and stops, after
its running jobs, once it is gone, instead of working on unsupervised beside the children of
the supervisor's replacement.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

logger = logging.getLogger("kumiko_jobs.worker")
POLL = 0.2
STARTUP_WINDOW = 10.0
MAX_STARTUP_FAILURES = 5
MAX_BACKOFF = 30.0
MEMORY_CHECK_INTERVAL = 5.0
# The supervisor's own options, left out of its children's command line (option -> takes a
# value). --name is not one of them: each child gets a name of its own made from it.
_OWN_OPTIONS = {"--processes": True, "--max-memory": True}
# In each child's environment: its supervisor's pid, for watch_supervisor.
SUPERVISOR_PID_ENV = "KUMIKO_JOBS_SUPERVISOR_PID"
# In a child's environment: "<lane>:<supervisor pid>", the lane whose boot gates its supervisor
# passed before starting it, so the child does not run them again.
GATES_PASSED_ENV = "KUMIKO_JOBS_BOOT_GATES_PASSED"
# How often a child looks for its supervisor: a getppid() call, nothing else.
SUPERVISOR_CHECK_INTERVAL = 1.0
# A supervised child's exit after its --max-jobs: replaced at once, under --burst too (there
# a plain 0 means the child found the lane empty).
EXIT_MAX_JOBS = 76
# A worker's exit when it recycles itself (a stuck job, a dead thread): restart me. Replaced
# at once, not counted as a crash.
EXIT_RECYCLE = 75
# runjobs' exit when a boot gate refused the code it runs (distinct from usage errors 1 and 2,
# for deploy scripts). In a child after a SIGHUP's reload, the new release must not take
# traffic: the supervisor stops and exits with it too, instead of restarting the child until it
# counts as a crash loop (exit 1), so a deploy script or systemd's RestartPreventExitStatus=3
# sees the gate's verdict.
EXIT_BOOT_GATE_FAILED = 3


@dataclass
class Child:
    slot: int
    proc: subprocess.Popen[bytes]
    started: float
    failures: int = 0  # consecutive exits within STARTUP_WINDOW
    restart_at: float | None = None
    # The supervisor stopped it to replace it (memory, SIGHUP): replaced even under --burst.
    recycling: bool = field(default=False)


def child_command(argv: list[str], slot: int) -> list[str]:
    """The interpreter's own command line without the supervisor's options, with a name per
    slot (so a restarted child is recognisable in logs and dashboards). Options are read as
    argparse reads them: ``--option value`` or ``--option=value``, the last ``--name`` winning."""
    args: list[str] = []
    name: str | None = None
    tokens = iter(argv)
    for arg in tokens:
        option, joined, value = arg.partition("=")
        if option == "--name":
            name = value if joined else next(tokens, None)
        elif option in _OWN_OPTIONS:
            if _OWN_OPTIONS[option] and not joined:
                next(tokens, None)  # its value
        else:
            args.append(arg)
    base = name or f"{os.uname().nodename}-{os.getpid()}"
    return [sys.executable, *args, "--name", f"{base}-p{slot}"]


class Supervisor:
    def __init__(
        self, processes: int, argv: list[str], *, gated_lane: str, max_memory_mb: int | None, burst: bool
    ) -> None:
        self.processes = processes
        self.argv = argv
        self.gated_lane = gated_lane  # whose boot gates this process passed before supervising
        # After a SIGHUP the children import newer code than the gates passed with.
        self.reloaded = False
        self.max_memory = max_memory_mb * 1024 * 1024 if max_memory_mb else None
        self.burst = burst
        self.children: list[Child] = []
        self.stopping = False
        self.failed = ""
        self.exit_code = 1  # when failed: 1, or EXIT_BOOT_GATE_FAILED
        self._next_memory_check = 0.0
        self._signals: list[int] = []  # noted by _note_signal, acted on by the loop

    def run(self) -> int:
        # The handlers only note a signal; the loop acts on it between its own steps. Acting in
        # the handler raced the loop: a SIGTERM while the children were being started signalled
        # none of them, and one during a restart's spawn left the new child in no list.
        signal.signal(signal.SIGTERM, self._note_signal)
        signal.signal(signal.SIGINT, self._note_signal)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup, hangups stay ignored
            signal.signal(signal.SIGHUP, self._note_signal)
        self.children = [self._start(slot) for slot in range(1, self.processes + 1)]
        logger.info("supervisor (pid %d) runs %d worker processes", os.getpid(), self.processes)
        while self.children:
            time.sleep(POLL)
            self._act_on_signals()
            self._tend()
        if self.failed:
            logger.error("supervisor stops: %s", self.failed)
            return self.exit_code
        return 0

    def _start(self, slot: int, failures: int = 0) -> Child:
        # Our own interpreter and command line: nothing here comes from outside the process.
        environment = {**os.environ, SUPERVISOR_PID_ENV: str(os.getpid())}
        # The gates passed here, with the code this process imported: they vouch for the
        # children that run that code (the first ones and their replacements), not for those
        # started after a SIGHUP, a deploy's reload of newer code (its gates may fail: "the
        # schema is behind"). So the mark goes into each child's environment, not into ours,
        # where every later child would inherit it.
        if not self.reloaded:
            environment[GATES_PASSED_ENV] = f"{self.gated_lane}:{os.getpid()}"
        proc = subprocess.Popen(child_command(self.argv, slot), env=environment, start_new_session=True)  # noqa: S603
        return Child(slot, proc, time.monotonic(), failures)

    def _tend(self) -> None:
        now = time.monotonic()
        for child in list(self.children):
            if child.restart_at is not None:
                if self.stopping:
                    # Waiting out a backoff when everything stops (a signal, or another child
                    # that kept dying): no process to wait for, and no restart to come.
                    self.children.remove(child)
                elif now >= child.restart_at:
                    self.children[self.children.index(child)] = self._start(child.slot, child.failures)
                continue
            code = child.proc.poll()
            if code is None:
                continue
            self._exited(child, code, now)
        if self.max_memory and now >= self._next_memory_check:
            self._next_memory_check = now + MEMORY_CHECK_INTERVAL
            self._recycle_large()

    def _fail(self, child: Child, why: str, exit_code: int = 1) -> None:
        """Give up: stop every child, and exit with ``exit_code`` saying ``why``."""
        self.failed, self.exit_code = why, exit_code
        self._stop_all(signal.SIGTERM)
        self.children.remove(child)

    def _exited(self, child: Child, code: int, now: float) -> None:
        # A child stopped for a restart may die of that SIGTERM before its handler is in place.
        # EXIT_RECYCLE: the child asked for its own replacement (a stuck job, a dead thread).
        clean = code in (0, EXIT_MAX_JOBS, EXIT_RECYCLE) or (child.recycling and code == -signal.SIGTERM)
        # Under --burst a plain 0 means the lane was empty, unless the supervisor asked for it.
        if self.stopping or (self.burst and code == 0 and not child.recycling):
            self.children.remove(child)
            return
        if code == EXIT_BOOT_GATE_FAILED and self.reloaded:
            why = f"a boot gate refused the reloaded code (exit {code})"
            self._fail(child, f"worker process {child.slot}: {why}", EXIT_BOOT_GATE_FAILED)
            return
        quick = now - child.started < STARTUP_WINDOW
        failures = child.failures + 1 if not clean and quick else 0
        if failures >= MAX_STARTUP_FAILURES:
            self._fail(
                child,
                f"worker process {child.slot} died {failures} times within {STARTUP_WINDOW:g}s "
                f"of its start (last exit {code})",
            )
            return
        delay = 0.0 if clean or not quick else min(2.0 ** (failures - 1), MAX_BACKOFF)
        log = logger.info if clean else logger.warning
        how = "ran its --max-jobs" if code == EXIT_MAX_JOBS else f"exited {code}"
        log("worker process %d (pid %d) %s; restarting it%s", child.slot, child.proc.pid, how,
            f" in {delay:g}s" if delay else "")  # fmt: skip
        child.failures, child.restart_at = failures, now + delay

    def _recycle_large(self) -> None:
        for child in self.children:
            if child.restart_at is None and not child.recycling and self.max_memory:
                rss = _resident_bytes(child.proc.pid)
                if rss is not None and rss > self.max_memory:
                    logger.warning("worker process %d uses %d MB; recycling it", child.slot, rss // 2**20)
                    self._recycle(child)

    def _note_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _act_on_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if signum == signal.SIGHUP:
                self._restart_all()
            else:
                self._stop(signum)

    def _restart_all(self) -> None:
        if self.stopping:
            return
        logger.info(
            "supervisor: SIGHUP received: restarting the worker processes once their running jobs finish"
        )
        self.reloaded = True
        for child in self.children:
            self._recycle(child)

    @staticmethod
    def _recycle(child: Child) -> None:
        """Stop a child (SIGTERM: it finishes its running jobs) so that it is replaced."""
        if child.restart_at is None and not child.recycling and child.proc.poll() is None:
            child.recycling = True
            child.proc.send_signal(signal.SIGTERM)

    def _stop(self, signum: int) -> None:
        if self.stopping:
            logger.warning("supervisor: second %s: killing the worker processes", signal.Signals(signum).name)
            self._stop_all(signal.SIGKILL)
            return
        self.stopping = True
        logger.info("supervisor: %s received: stopping the worker processes", signal.Signals(signum).name)
        self._stop_all(signal.SIGTERM)
        self.children = [c for c in self.children if c.restart_at is None]

    def _stop_all(self, signum: int) -> None:
        self.stopping = True
        for child in self.children:
            if child.restart_at is None and child.proc.poll() is None:
                child.proc.send_signal(signum)


def _resident_bytes(pid: int) -> int | None:
    """A process's resident memory, None if it is gone: from /proc on Linux, from ``ps`` where
    there is none (macOS, the BSDs), so --max-memory works there too."""
    return _resident_from_proc(pid) if os.path.isdir("/proc/self") else _resident_from_ps(pid)


def _resident_from_proc(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _resident_from_ps(pid: int) -> int | None:
    # POSIX ps: -o rss= prints the resident set size in KiB, without a header.
    try:
        out = subprocess.run(  # noqa: S603
            ["ps", "-o", "rss=", "-p", str(pid)],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out) * 1024 if out.isdigit() else None


def watch_supervisor() -> bool:
    """In a worker process a supervisor started: stop as on SIGTERM (after the running jobs)
    once that supervisor is gone, and return True. Reads and removes SUPERVISOR_PID_ENV, so the
    processes its jobs start do not inherit it; elsewhere it does nothing (False)."""
    value = os.environ.pop(SUPERVISOR_PID_ENV, None)
    if value is None:
        return False
    supervisor = int(value)

    def watch() -> None:
        # The child is re-parented when its parent dies, so its parent's pid changes.
        while os.getppid() == supervisor:
            time.sleep(SUPERVISOR_CHECK_INTERVAL)
        logger.warning(
            "worker process %d: its supervisor (pid %d) is gone; finishing the running jobs, then stopping",
            os.getpid(),
            supervisor,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="kumiko-supervisor-watch", daemon=True).start()
    return True


def gates_passed_by_supervisor(lane: str) -> bool:
    """Whether this process's supervisor passed ``lane``'s boot gates for it. Reads and removes
    GATES_PASSED_ENV, so the processes its jobs start (a ``runjobs`` among them) do not inherit
    it; it counts only in a child of the supervisor that set it, so a copy of it that reached
    any other process (an environment captured before this ran) runs the gates all the same."""
    value = os.environ.pop(GATES_PASSED_ENV, None)
    return value == f"{lane}:{os.getppid()}"


def supervise(
    processes: int, argv: list[str], *, gated_lane: str, max_memory_mb: int | None, burst: bool
) -> int:
    return Supervisor(processes, argv, gated_lane=gated_lane, max_memory_mb=max_memory_mb, burst=burst).run()
