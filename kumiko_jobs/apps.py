from __future__ import annotations

from django.apps import AppConfig


class KumikoJobsConfig(AppConfig):
    name = "kumiko_jobs"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from kumiko_jobs import checks  # noqa: F401  (registers the system checks)
        from kumiko_jobs.conf import get_config

        autodiscover_modules(get_config()["JOB_MODULE"])
        # The built-in jobs (retention), whatever JOB_MODULE says.
        from kumiko_jobs import jobs  # noqa: F401
