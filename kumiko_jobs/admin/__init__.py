"""The operator console inside the Django admin.

Pages: an overview of lanes and tenants (``console``), the job catalog with a Trigger form
(``catalog``), the run browser with retry and cancel (``runs``), tenant failure records
(``failures``) and the escape-hatch audit list (``audits``).

Operators (superusers) see everything. Staff whose tenant ``KUMIKO_JOBS["USER_TENANT"]`` names
see only that tenant's tenant-visible runs and failure records, never payloads, error text,
tracebacks or log lines (``access.py``); staff without a tenant see nothing. The run table may
hold millions of rows, so no page counts or scans it whole (``changelist.py``, ``lane_stats``).
"""

from __future__ import annotations

# Importing the modules registers their ModelAdmins with the default admin site.
from kumiko_jobs.admin.audits import EscapeHatchAuditAdmin
from kumiko_jobs.admin.catalog import JobCatalogAdmin
from kumiko_jobs.admin.console import ConsoleOverviewAdmin
from kumiko_jobs.admin.failures import TenantFailureAdmin
from kumiko_jobs.admin.runs import JobRunAdmin

__all__ = [
    "ConsoleOverviewAdmin",
    "EscapeHatchAuditAdmin",
    "JobCatalogAdmin",
    "JobRunAdmin",
    "TenantFailureAdmin",
]
