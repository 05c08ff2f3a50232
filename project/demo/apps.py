from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project.demo"
    label = "demo"
    verbose_name = "Demo tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from project import telemetry

        # Before the first request: DjangoInstrumentor adds its middleware to the settings.
        telemetry.configure()
