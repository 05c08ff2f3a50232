"""A table in the public schema and in every tenant's: where a run's row lands shows its schema."""

from django.db import models


class Note(models.Model):
    label = models.CharField(max_length=100)
    # What the handler saw: kumiko's current tenant and PostgreSQL's current_schema().
    tenant = models.CharField(max_length=64, blank=True)
    schema = models.CharField(max_length=63)

    def __str__(self) -> str:
        return self.label
