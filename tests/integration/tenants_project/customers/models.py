"""The tenants (django-tenants' TenantMixin) and their domains, in the public schema."""

from django.db import models
from django_tenants.models import DomainMixin, TenantMixin


class Client(TenantMixin):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class Domain(DomainMixin):
    def __str__(self) -> str:
        return str(self.domain)
