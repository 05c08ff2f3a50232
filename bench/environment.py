"""The bench's private world: its own key prefix, database, settings and child processes.

Everything the bench writes carries its prefix (queue names, job ids, worker names), so one
SCAN finds it all for the clean-up, and another deployment's keys are never touched.
"""

from __future__ import annotations

import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

# absolute(), not resolve(): a symlinked bench/ runs against the tree it is linked into.
ROOT = Path(__file__).absolute().parent.parent
SETTINGS_MODULE = "bench.settings"
# The prefix lands in key globs and job ids (RQ allows [A-Za-z0-9_-] there): letters only keeps
# the SCAN pattern exact and the job-id tag equal to the prefix.
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_]{4,40}")
# Sets RQ keeps across all queues and workers; our members are removed one by one.
RQ_GLOBAL_SETS = ("rq:queues", "rq:workers")


class BenchError(Exception):
    """The bench cannot run or a measurement went wrong; the message says what to do."""


def new_prefix() -> str:
    return f"bench_{secrets.token_hex(4)}"


def check_prefix(prefix: str) -> str:
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise BenchError(f"--prefix {prefix!r} must be 4-40 characters of [A-Za-z0-9_].")
    return prefix


@dataclass
class BenchEnv:
    """Connection facts shared by every measurement, plus the processes to stop at the end."""

    prefix: str
    redis_url: str
    database_url: str
    db_label: str
    client: redis.Redis
    tenant_id: str = ""
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def child_env(self, **overrides: str) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "DATABASE_URL": self.database_url,
            "KUMIKO_QUEUE_PREFIX": self.prefix,
            "KUMIKO_REDIS_URL": self.redis_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        }
        return {**env, **overrides}

    def run_child(
        self, argv: Sequence[str], *, timeout: float, **env: str
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a Python child to its end (killed on timeout); output kept for error messages."""
        process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=self.child_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.children.append(process)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            tail = output.decode()[-3000:]
            raise BenchError(
                f"{' '.join(argv)} did not finish within {timeout:.0f}s; its output:\n{tail}"
            ) from None
        finally:
            # Still running only if we were interrupted: stop_children() ends it then.
            if process.poll() is not None:
                self.children.remove(process)
        if process.returncode != 0:
            raise BenchError(
                f"{' '.join(argv)} exited {process.returncode}; its output:\n{output.decode()[-3000:]}"
            )
        return subprocess.CompletedProcess(process.args, process.returncode, output)

    def stop_children(self) -> None:
        for process in list(self.children):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.children.clear()


def own_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"*{prefix}*", count=1000))


def delete_own_keys(client: redis.Redis, prefix: str) -> int:
    keys = own_keys(client, prefix)
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    for name in RQ_GLOBAL_SETS:
        members = [m for m in client.smembers(name) if prefix.encode() in m]
        if members:
            client.srem(name, *members)
    return len(keys)


@contextmanager
def bench_database(db: str | None) -> Iterator[tuple[str, str]]:
    """(DATABASE_URL, label): the given URL, or a throwaway SQLite file removed afterwards."""
    if db and db != "sqlite":
        yield db, db.split(":", 1)[0]
        return
    workdir = Path(tempfile.mkdtemp(prefix="kumiko-bench-"))
    try:
        yield f"sqlite:///{workdir / 'bench.sqlite3'}", "sqlite"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def setup_django(env: BenchEnv) -> None:
    """Start Django in this process on the bench database, migrated, and pick a demo tenant."""
    # The caller's variables may name a live deployment: the bench's own win, before setup.
    os.environ.update(
        DJANGO_SETTINGS_MODULE=SETTINGS_MODULE,
        DATABASE_URL=env.database_url,
        KUMIKO_QUEUE_PREFIX=env.prefix,
        KUMIKO_REDIS_URL=env.redis_url,
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    vacuum_runs()
    from project.demo.models import Tenant

    tenant = Tenant.objects.filter(active=True).order_by("pk").first()
    if tenant is None:
        raise BenchError("the migrated database has no active demo tenant (project/demo seeds three)")
    env.tenant_id = str(tenant.pk)


def delete_own_rows(prefix: str) -> int:
    """Remove the bench's run records (matters on a PostgreSQL database that outlives the run)."""
    from kumiko_jobs.models import JobRun

    deleted, _ = JobRun.objects.filter(job_id__startswith=prefix).delete()
    return deleted


def vacuum_runs() -> None:
    """VACUUM (ANALYZE) the run table on PostgreSQL, so every section measures a table without
    the dead rows of earlier runs (the console section alone inserts and deletes 1,000,000 per
    run): the bench database outlives a run, and autovacuum may be off (it is on this machine's
    server), which left 1.6 million dead rows and 1 GB in the run table between bench runs."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE) kumiko_jobs_jobrun")


def reset(env: BenchEnv) -> None:
    """Back to an empty lane: every key and run row of the bench goes (stop its workers first)."""
    delete_own_keys(env.client, env.prefix)
    delete_own_rows(env.prefix)


def machine_facts(env: BenchEnv) -> dict[str, str]:
    import django
    import rq
    from django.db import connection

    server = env.client.info("server")
    facts = {
        "cpus (nproc)": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "django / rq / redis-py": f"{django.get_version()} / {rq.__version__} / {redis.__version__}",
        "redis-server": f"{server.get('redis_version')} at {_redacted(env.redis_url)}",
        "database": _database_description(connection),
        "load average at start": load_average(),
    }
    return facts


def load_average() -> str:
    """1/5/15-minute load: above the core count, a neighbour shares the CPUs and figures drop."""
    return " / ".join(f"{load:.2f}" for load in os.getloadavg())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _database_description(connection: Any) -> str:
    connection.ensure_connection()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            (journal,) = cursor.fetchone()
            cursor.execute("PRAGMA synchronous")
            (sync,) = cursor.fetchone()
        import sqlite3

        synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, str(sync))
        return f"SQLite {sqlite3.sqlite_version} (temp file, journal={journal}, synchronous={synchronous})"
    if connection.vendor == "postgresql":
        version = connection.pg_version
        major, minor = divmod(version, 10000)
        where = f"{connection.settings_dict['HOST']}:{connection.settings_dict['PORT']}"
        return f"PostgreSQL {major}.{minor} at {where}"
    return str(connection.vendor)


def _redacted(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)
