"""A new user's project, as the README's "Use it in your project" tells it, with Django's
defaults: ``django-admin startproject`` in a temporary directory, this repository installed
from a wheel (not editable) into a fresh venv, only the README's settings and URLs, a job in
an app's jobs.py, PostgreSQL in a throwaway database (Django's default ``CONN_MAX_AGE=0``),
``runjobs`` before ``migrate`` (refused) and ``--burst`` after it, and the admin and
django-rq's dashboard over real HTTP from ``runserver``.

The venv and the wheel are built once per module (pip uses its cache and the package index).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import datetime
from http.cookiejar import CookieJar
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import HTTPCookieProcessor, Request, build_opener

import pytest

from kumiko_jobs.conf import redis_url
from tests.integration.redis_servers import free_port
from tests.integration.support import REPO_ROOT, logged_at, wait_until

pytestmark = pytest.mark.slow

PG = {"host": "127.0.0.1", "port": "5432", "user": "postgres"}
# What the package is built from: the tracked sources, not build leftovers in the work tree.
PACKAGE_FILES = ("pyproject.toml", "README.md", "kumiko_jobs")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing of this test run's Django, venv or Redis."""
    dropped = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("KUMIKO_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def run(args: list[str | Path], cwd: Path, timeout: float = 300, *, stderr: bool = False, **env: str) -> str:
    """Run a command like a user's shell would; return its stdout (and stderr after it, with
    ``stderr``), fail with all its output."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        output = done.stdout + done.stderr
        raise AssertionError(f"{' '.join(map(str, args))} exited {done.returncode}:\n{output}")
    return done.stdout + done.stderr if stderr else done.stdout


def assert_stopped_promptly(output: str) -> None:
    """Each worker in ``output`` wrote its last line within a few seconds of ending its job loop:
    with redis-py 8.2, which a fresh install gets, a stop that waited for RQ's listener thread
    took 60 s (it passed, only slowly, until this was checked)."""
    line = r"^(\S+ \S+ \S+ kumiko_jobs\.worker: worker (\S+?):? (\d+ lane steps|stopped after))"
    ended: dict[str, datetime] = {}
    stops = 0
    for text, worker, what in re.findall(line, output, flags=re.MULTILINE):
        when = logged_at(text)
        if what != "stopped after":
            ended[worker] = when
            continue
        stops += 1
        assert (when - ended[worker]).total_seconds() < 5, output
    assert stops, output


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with this repository installed from its wheel, as ``pip install .`` would."""
    root = tmp_path_factory.mktemp("new-project-venv")
    source = root / "source"
    source.mkdir()
    for name in PACKAGE_FILES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    wheels = root / "wheels"
    # Built with this venv's setuptools (no isolated build env to download), then installed
    # with its dependencies resolved from the index like any user's install.
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source],
        root,
    )
    [wheel] = wheels.glob("kumiko_jobs-*.whl")
    run([sys.executable, "-m", "venv", root / "venv"], root)
    bin_dir = root / "venv" / "bin"
    run([bin_dir / "python", "-m", "pip", "install", "--quiet", wheel, "psycopg[binary]"], root, timeout=600)
    yield bin_dir
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def database() -> Iterator[str]:
    """A throwaway PostgreSQL database for the project, dropped afterwards."""
    if shutil.which("createdb") is None:
        pytest.fail("PostgreSQL client tools (createdb, dropdb) are needed for the new-project test")
    name = f"kumiko_newproject_{uuid.uuid4().hex[:8]}"
    args = ["-h", PG["host"], "-p", PG["port"], "-U", PG["user"]]
    subprocess.run(["createdb", *args, name], check=True, capture_output=True)
    yield name
    subprocess.run(["dropdb", *args, "--force", "--if-exists", name], check=True, capture_output=True)


def make_project(bin_dir: Path, where: Path, database: str, prefix: str) -> Path:
    """startproject + startapp, then exactly what the README tells a user to add."""
    run([bin_dir / "django-admin", "startproject", "mysite", where], where.parent)
    run([bin_dir / "python", "manage.py", "startapp", "billing"], where)
    settings = where / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text()
        + textwrap.dedent(f"""

            # README, "Use it in your project", step 2.
            INSTALLED_APPS += ["django_rq", "kumiko_jobs"]
            KUMIKO_JOBS = {{
                "REDIS": {redis_url()!r},
                "QUEUE_PREFIX": {prefix!r},
            }}

            # The project's own choices: its app, and PostgreSQL (CONN_MAX_AGE stays Django's 0).
            INSTALLED_APPS += ["billing"]
            DATABASES = {{
                "default": {{
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": {database!r},
                    "USER": {PG["user"]!r},
                    "HOST": {PG["host"]!r},
                    "PORT": {PG["port"]!r},
                }}
            }}
        """)
    )
    # How a deployment usually switches DEBUG off: a settings module of its own on top.
    (where / "mysite" / "production.py").write_text(
        'from .settings import *  # noqa: F403\n\nDEBUG = False\nALLOWED_HOSTS = ["127.0.0.1"]\n'
    )
    urls = where / "mysite" / "urls.py"
    text = urls.read_text().replace("from django.urls import path", "from django.urls import include, path")
    text = text.replace(
        "path('admin/', admin.site.urls),",
        "path('admin/', admin.site.urls),\n    path('django-rq/', include('kumiko_jobs.dashboard.urls')),",
    ).replace(
        'path("admin/", admin.site.urls),',
        'path("admin/", admin.site.urls),\n    path("django-rq/", include("kumiko_jobs.dashboard.urls")),',
    )
    assert "kumiko_jobs.dashboard.urls" in text, urls.read_text()
    urls.write_text(text)
    (where / "billing" / "jobs.py").write_text(
        textwrap.dedent("""\
            from kumiko_jobs import job


            @job(retries=3, backoff="exponential", timeout=60)
            def send_invoice(payload, ctx):
                ctx.log.info("sending invoice %s", payload["invoice_id"])
        """)
    )
    return where


class Browser:
    """An admin user's HTTP session against runserver (cookies, CSRF, login)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = CookieJar()
        self.opener = build_opener(HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as response:
            assert response.status == 200, path
            return str(response.read().decode())

    def login(self, username: str, password: str) -> None:
        page = self.get("/admin/login/")
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, page
        form = {
            "csrfmiddlewaretoken": match[1],
            "username": username,
            "password": password,
            "next": "/admin/",
        }
        request = Request(self.base + "/admin/login/", data=urlencode(form).encode(), method="POST")  # noqa: S310
        request.add_header("Referer", self.base + "/admin/login/")
        with self.opener.open(request, timeout=30) as response:
            assert response.url.endswith("/admin/"), f"login failed: {response.url}"


@pytest.mark.timeout(600)  # a cold pip cache downloads the dependencies
def test_a_new_project_runs_jobs_and_shows_them(
    venv_bin: Path, database: str, tmp_path: Path, kumiko_prefix: str
) -> None:
    project = make_project(venv_bin, tmp_path / "mysite", database, kumiko_prefix)
    python = venv_bin / "python"

    def manage(*args: str, stderr: bool = False, **env: str) -> str:
        return run([python, "manage.py", *args], project, stderr=stderr, **env)

    checked = manage("check")
    assert "no issues (0 silenced)" in checked, checked
    # A worker started before `migrate` (the step a new user forgets): one line naming it.
    early = subprocess.run(
        [str(python), "manage.py", "runjobs", "--lane", "worker", "--burst"],
        cwd=project, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert early.returncode == 1, early.stdout + early.stderr
    assert "migration(s) kumiko_jobs needs (kumiko_jobs.0001_initial," in early.stderr, early.stderr
    assert "Run `manage.py migrate` before starting workers." in early.stderr
    assert "Traceback" not in early.stderr
    manage("migrate", "--noinput")

    shell = (
        "from kumiko_jobs import dispatch; print(dispatch('billing.send_invoice', {'invoice_id': %d}).job_id)"
    )
    done_id = manage("shell", "--no-imports", "-c", shell % 1).strip()
    more = (
        "from django.db import connection\n"
        "from kumiko_jobs import dispatch\n"
        "for i in range(100, 150): dispatch('billing.send_invoice', {'invoice_id': i})\n"
        "with connection.cursor() as c:\n"
        "    c.execute(\"SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'kumiko_%'\")\n"
        "    print(c.fetchone()[0])"
    )
    # startproject's DEBUG = True keeps every query in connection.queries, so the run-record
    # writes go through a cursor; with DEBUG off (production) they take libpq's pipeline,
    # prepared on the session (pg_pipeline.py): the INSERT and the set_config before it. Both
    # paths run here.
    assert manage("shell", "--no-imports", "-c", more).strip() == "0"
    production = {"DJANGO_SETTINGS_MODULE": "mysite.production"}
    more_in_production = more.replace("100, 150", "150, 200")
    assert manage("shell", "--no-imports", "-c", more_in_production, **production).strip() == "2"
    worked = manage("runjobs", "--lane", "worker", "--burst", stderr=True, **production)
    assert_stopped_promptly(worked)
    # Django's default logging, CONN_MAX_AGE 0: the worker's lines reach stderr, and it keeps
    # one connection for its 101 jobs and its writer thread one (it once opened one per job).
    opened = re.search(r"stopped after (\d+) jobs .*; database connections opened: (\d+)", worked)
    assert opened and int(opened[1]) == 101 and int(opened[2]) <= 2, worked
    # --threads 4 in the same project: the claimer makes the threads' lane steps, several in a
    # script call (claiming.py), the writer writes their successes, several in a round trip
    # (success_writes.py), and each thread keeps one connection (+ the marker's, the writer's and
    # the main one).
    sixty = (
        "from kumiko_jobs import dispatch\n"
        "for i in range(200, 260): dispatch('billing.send_invoice', {'invoice_id': i})"
    )
    manage("shell", "--no-imports", "-c", sixty, **production)
    worked = manage("runjobs", "--lane", "worker", "--burst", "--threads", "4", stderr=True, **production)
    assert_stopped_promptly(worked)
    opened = re.search(r"stopped after (\d+) jobs .*; database connections opened: (\d+)", worked)
    assert opened and int(opened[1]) == 60 and int(opened[2]) <= 4 + 3, worked
    batching = r"(\d+) lane steps in (\d+) script calls .*; (\d+) successes written in (\d+)"
    batched = re.search(batching, worked)
    assert batched and int(batched[1]) >= 120 and int(batched[2]) <= int(batched[1]), worked
    assert int(batched[3]) == 60 and int(batched[4]) <= 60, worked
    # And with startproject's own settings (DEBUG on): no pipeline, so the writer writes each
    # success through a cursor.
    twenty = sixty.replace("200, 260", "260, 280")
    manage("shell", "--no-imports", "-c", twenty)
    worked = manage("runjobs", "--lane", "worker", "--burst", "--threads", "4", stderr=True)
    assert_stopped_promptly(worked)
    opened = re.search(r"stopped after (\d+) jobs .*; database connections opened: (\d+)", worked)
    assert opened and int(opened[1]) == 20 and int(opened[2]) <= 4 + 3, worked
    batched = re.search(batching, worked)
    assert batched and int(batched[3]) == 20, worked
    # --processes 2 from the project's own manage.py: the supervisor starts two children with
    # the same command line, each one thread with its connection and its writer's, and exits 0
    # once both have emptied the lane.
    forty = sixty.replace("200, 260", "280, 320")
    manage("shell", "--no-imports", "-c", forty, **production)
    worked = manage("runjobs", "--lane", "worker", "--burst", "--processes", "2", stderr=True, **production)
    assert_stopped_promptly(worked)
    child_shutdown = r"worker \S+-p[12] .*stopped after (\d+) jobs .*; database connections opened: (\d+)"
    children = re.findall(child_shutdown, worked)
    assert len(children) == 2 and sum(int(jobs) for jobs, _ in children) == 40, worked
    assert all(int(opened) <= 2 for _, opened in children), worked
    succeeded = manage(
        "shell",
        "--no-imports",
        "-c",
        "from kumiko_jobs.models import JobRun; print(JobRun.objects.filter(status='succeeded').count())",
    )
    assert succeeded.strip() == "221"
    status = manage(
        "shell",
        "--no-imports",
        "-c",
        "from kumiko_jobs.models import JobRun\n"
        f"run = JobRun.objects.get(job_id={done_id!r})\n"
        "print(run.status, run.id.version)",
    )
    # Run ids are time-ordered (UUID version 7, run_ids.py) after the package's migrations.
    assert status.strip() == "succeeded 7"
    # This one stays queued: the dashboard shows it.
    waiting_id = manage("shell", "--no-imports", "-c", shell % 2).strip()

    manage("createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com",
           DJANGO_SUPERUSER_PASSWORD="a-long-password")  # fmt: skip
    names = sorted(f"{kumiko_prefix}:{lane}" for lane in ("api", "worker"))
    port = free_port()
    log_path = tmp_path / "runserver.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=project, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        browser = Browser(f"http://127.0.0.1:{port}")

        def answers() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"runserver exited {server.returncode}:\n{log_path.read_text()}")
            try:
                browser.get("/admin/login/")
            except OSError:
                return False
            return True

        wait_until(answers, 30, "runserver to answer")
        browser.login("admin", "a-long-password")

        runs = browser.get("/admin/kumiko_jobs/jobrun/")
        assert "billing.send_invoice" in runs and "Succeeded" in runs and "Queued" in runs

        front = browser.get("/django-rq/")
        index = names.index(f"{kumiko_prefix}:worker")
        assert f"{kumiko_prefix}:worker" in front
        queued = re.search(rf'href="/django-rq/queues/{index}/">\s*(\d+)\s*<', front)
        finished = re.search(rf'href="/django-rq/queues/{index}/finished/">\s*(\d+)\s*<', front)
        assert queued and finished, front
        # A succeeded job leaves Redis at once (RESULT_TTL 0): its history is the admin's.
        assert (int(queued[1]), int(finished[1])) == (1, 0)
        assert waiting_id in browser.get(f"/django-rq/queues/{index}/")
        assert done_id not in browser.get(f"/django-rq/queues/{index}/finished/")
    finally:
        os.killpg(server.pid, 15)
        server.wait(10)
