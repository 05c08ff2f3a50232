"""Read-only admin: the run browser (``JobRun``) and the escape-hatch audit list.

Operators (superusers) see everything. Staff whose tenant ``KUMIKO_JOBS["USER_TENANT"]`` names
see only that tenant's runs and never payloads, error text, tracebacks or log lines; staff
without a tenant see nothing. The run table may hold millions of rows, so the run browser
never counts or scans it whole (``changelist.py``).
"""

from __future__ import annotations

# Importing the modules registers their ModelAdmins with the default admin site.
from kumiko_jobs.admin.audits import EscapeHatchAuditAdmin
from kumiko_jobs.admin.runs import JobRunAdmin

__all__ = ["EscapeHatchAuditAdmin", "JobRunAdmin"]
