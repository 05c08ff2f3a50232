from __future__ import annotations

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
        from kumiko_jobs.scrubbing import install_log_filter

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
