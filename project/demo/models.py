"""Demo models: tenants and a tenant-scoped model (django-scopes)."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models
from django_scopes import ScopedManager


# The django-stubs plugin cannot type ``tenant.notes``: Note's manager class is built at run
# time by django-scopes, which has no type information.
class Tenant(models.Model):  # type: ignore[django-manager-missing]
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(unique=True)
    active = models.BooleanField(default=True)
    # Users who act for this tenant: its staff in the admin, and readers of its jobs page.
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="demo_tenants")

    def __str__(self) -> str:
        return self.name


class Note(models.Model):
    """Written by demo jobs; scoped, so a job only sees its own tenant's notes."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notes")
    text = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    # django-scopes is untyped; to mypy its manager is a plain Manager of notes.
    objects: ClassVar[models.Manager[Note]] = ScopedManager(tenant="tenant")

    def __str__(self) -> str:
        return self.text
