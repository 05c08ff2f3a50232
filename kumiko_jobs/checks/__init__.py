"""System checks ``kumiko_jobs.E0xx``/``W0xx``: one id per rule, each with a hint.

``jobs.py`` checks every declaration, one function per option group; ``settings.py`` checks
``settings.KUMIKO_JOBS``, ``redis.py`` the Redis setting; ``schedules.py`` holds the groups and
rules of schedules, boot and events that those two run. All are registered when the app is
ready (apps.py imports this package).
"""

from __future__ import annotations

from kumiko_jobs.checks.jobs import check_definition, check_jobs
from kumiko_jobs.checks.redis import check_redis_setting
from kumiko_jobs.checks.settings import check_settings

__all__ = ["check_definition", "check_jobs", "check_redis_setting", "check_settings"]
