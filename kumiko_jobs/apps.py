from __future__ import annotations

from typing import Any

from django.apps import AppConfig, apps


class KumikoJobsConfig(AppConfig):
    name = "kumiko_jobs"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # Importing the check modules registers the system checks.
        from kumiko_jobs import checks, rq_guard  # noqa: F401
        from kumiko_jobs.conf import get_config
        from kumiko_jobs.scrubbing import TASK_LOGGERS, install_log_filter

        install_log_filter()
        autodiscover_modules(get_config()["JOB_MODULE"])
        # The built-in jobs (retention), whatever JOB_MODULE says.
        from kumiko_jobs import jobs  # noqa: F401

        rq_guard.install()
        if apps.is_installed("django_rq"):
            from kumiko_jobs.dashboard import checks as dashboard_checks  # noqa: F401
            from kumiko_jobs.dashboard import setup

            setup.install()
            if apps.is_installed("django.contrib.admin"):
                import django_rq.admin  # noqa: F401  (registers django-rq's link, replaced next)

                from kumiko_jobs.dashboard import admin as dashboard_admin

                dashboard_admin.install()
        if uses_kumiko_task_backend():
            # Django @task functions become jobs when their module is imported: import them now,
            # so workers and the admin know them (others are imported on first use).
            from kumiko_jobs import backends  # noqa: F401  (registers the task resolver)

            install_log_filter(TASK_LOGGERS)

            if isinstance(get_config()["TASK_MODULE"], str):
                autodiscover_modules(get_config()["TASK_MODULE"])


def uses_kumiko_task_backend() -> bool:
    """Whether some ``TASKS`` alias names KumikoTaskBackend (or a subclass)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    aliases: Any = getattr(settings, "TASKS", {})
    for params in aliases.values() if isinstance(aliases, dict) else ():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend = import_string(path)
        except ImportError:
            continue  # Django's own check reports a BACKEND that does not import
        from kumiko_jobs.backends import KumikoTaskBackend

        if isinstance(backend, type) and issubclass(backend, KumikoTaskBackend):
            return True
    return False
