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
        from kumiko_jobs.scrubbing import install_log_filter

        install_log_filter()
        autodiscover_modules(get_config()["JOB_MODULE"])
