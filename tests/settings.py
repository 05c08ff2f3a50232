"""Test settings: the demo project plus a test app whose jobs the tests (and their workers) run."""

from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so runjobs subprocesses see the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "test.sqlite3")}
