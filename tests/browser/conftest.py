"""Browser tests: the admin console driven in headless Chromium through Playwright.

The browser is Debian's ``chromium`` (``/usr/bin/chromium``, or ``KUMIKO_CHROMIUM``), never a
build Playwright downloads; ``make test`` and ``.ci/run`` install it with apt when it is
missing, and these tests FAIL (they do not skip) when it still is. Each test gets a fresh
profile; screenshots land in ``test-artifacts/browser/`` (``KUMIKO_ARTIFACTS`` overrides), which
CI keeps as the run's artefacts.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("KUMIKO_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("KUMIKO_ARTIFACTS", ROOT / "test-artifacts")) / "browser"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PASSWORD = "browser-test-password"


@pytest.fixture(autouse=True)
def allow_orm_beside_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    # Playwright's sync API runs an asyncio loop in this thread, so Django would refuse the
    # test's own ORM calls as "async context". They are plain sync calls between page steps.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"No Chromium at {CHROMIUM}: the browser tests need Debian's package. Install it with "
            "`apt-get install -y chromium` (make test and .ci/run do), or set KUMIKO_CHROMIUM.",
            pytrace=False,
        )
    return CHROMIUM


@pytest.fixture
def browser_context(chromium_path: str, tmp_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data-dir per test
            executable_path=chromium_path,
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()
            # With Playwright's loop running, Django keeps this thread's connections per async
            # context (asgiref's Local): close the ones the test opened before the loop ends,
            # or the test database cannot be flushed and dropped.
            connections.close_all()


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Any:
    """``screenshot(page, "step")`` keeps a full-page PNG as a test artefact."""
    folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page: Any, step: str) -> Path:
        path = folder / f"{step}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def login(browser_context: Any, live_server: Any, django_user_model: Any) -> Any:
    """``login(username, superuser=False, permissions=())`` -> a page logged in through the
    admin's login form, as a new superuser or a staff user with these permission codenames."""
    from django.contrib.auth.models import Permission

    def log_in(username: str, *, superuser: bool = False, permissions: tuple[str, ...] = ()) -> Any:
        if superuser:
            django_user_model.objects.create_superuser(username, f"{username}@example.invalid", PASSWORD)
        else:
            user = django_user_model.objects.create_user(username, password=PASSWORD, is_staff=True)
            user.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
        page = browser_context.new_page()
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")
        return page

    return log_in
