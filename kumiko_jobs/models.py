"""Run history and escape-hatch audits, kept in the project's database.

A JobRun is one logical run: retries and deferrals move the same row through its states
(``queued → running → succeeded | failed``; a retry goes back to ``queued`` with the next
attempt). State changes are single guarded UPDATEs in ``records.py`` and ``attempt_records.py``.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from kumiko_jobs.run_ids import new_run_id


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    DEFERRED = "deferred", "Deferred"
    DROPPED = "dropped", "Dropped"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.DROPPED)
# Job id columns (job_id, fanout_of, fanout_parent). Was 100: a 64-character QUEUE_PREFIX with
# a ':' made a plain dispatch's id 104 characters and a fan-out child's up to 149.
JOB_ID_LENGTH = 255


class JobRun(models.Model):
    id = models.UUIDField(primary_key=True, default=new_run_id, editable=False)
    job_name = models.CharField(max_length=200)
    # NULL means "no tenant" (system runs); the id of a tenant is never empty.
    tenant_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    # Integers with validators rather than PositiveIntegerFields, whose database CHECK every
    # INSERT and UPDATE would pay for (Meta.constraints says why the table has none).
    attempt = models.IntegerField(default=1, validators=[MinValueValidator(1)])
    max_attempts = models.IntegerField(default=1, validators=[MinValueValidator(0)])
    subject = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    lane = models.CharField(max_length=16)
    # Unique through Meta.constraints: a field's unique=True adds a second, LIKE-pattern index on
    # PostgreSQL that nothing queries and every insert would pay for. Wide enough for the longest
    # id the package makes (a tz="tenant" tick's child under a 64-character prefix: 149).
    job_id = models.CharField(max_length=JOB_ID_LENGTH)
    trigger_name = models.CharField(max_length=200, blank=True, default="")
    triggered_by = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001  (no user)
    correlation_id = models.CharField(max_length=64, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    queued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    logs = models.JSONField(default=list, blank=True)
    # A Django task's return value (JSON), set when it succeeds; NULL otherwise.
    result = models.JSONField(null=True, blank=True)
    defer_count = models.IntegerField(default=0, validators=[MinValueValidator(0)])
    # Per-tenant fan-out wrappers: how many tenant runs this run enqueued.
    fanout_count = models.IntegerField(null=True, blank=True, validators=[MinValueValidator(0)])
    # A retry of a failed run is a new run that points at the one it retries.
    retry_of = models.UUIDField(null=True, blank=True)  # indexed where set: Meta.indexes
    # A wrapper's children get job ids derived from this job id (a retried wrapper's from the
    # original's), so a retry enqueues only the tenants the original did not reach.
    fanout_of = models.CharField(max_length=JOB_ID_LENGTH, blank=True, default="")
    # A fan-out child: the job id its wrapper's children ids derive from (the original wrapper).
    fanout_parent = models.CharField(max_length=JOB_ID_LENGTH, blank=True, default="")
    # The tenant may see this run (tenant_visible_run, and the run has a tenant): see
    # kumiko_jobs.tenant_history for what of it.
    tenant_visible = models.BooleanField(default=False)
    # When the run reached Redis. Unset only for a run recorded in a caller's transaction whose
    # push after commit has not happened yet (rebuild.push_waiting finds those).
    pushed_at = models.DateTimeField(null=True, blank=True)
    # Runs a cron schedule fired: the tick's time (ctx.scheduled_at). A tz="tenant" tick has one
    # fan-out wrapper per time zone in use, each naming the zone whose tenants it reaches; kept
    # here so a rebuild from the records or a retry reaches the same tenants at the same tick.
    scheduled_at = models.DateTimeField(null=True, blank=True)
    zone = models.CharField(max_length=64, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-queued_at",)
        # Operators' access to django-rq's dashboard (every tenant's jobs): kumiko_jobs.dashboard.
        permissions = (("use_rq_dashboard", "Can use the django-rq dashboard (jobs of every tenant)"),)
        # Every index costs each dispatch an insert into it: these serve the admin's filters
        # (lane is two values, so lane filters ride on the queued_at index).
        indexes = (
            models.Index(fields=("tenant_id", "status", "-queued_at"), name="kj_run_tenant_status"),
            models.Index(fields=("job_name", "status", "-queued_at"), name="kj_run_job_status"),
            models.Index(fields=("status", "-queued_at"), name="kj_run_status"),
            # Also retention's walk over the oldest runs (retention.py), so pruning adds no index.
            models.Index(fields=("-queued_at",), name="kj_run_queued_at"),
            # The runs of one request (CorrelationMiddleware) or chain: the admin's correlation filter.
            models.Index(fields=("correlation_id", "-queued_at"), name="kj_run_correlation"),
            # Partial: only rows of their kind pay for these.
            models.Index(
                fields=("tenant_id", "-queued_at"),
                name="kj_run_tenant_visible",
                condition=Q(tenant_visible=True),
            ),
            models.Index(
                fields=("tenant_id", "job_name", "subject", "-queued_at"),
                name="kj_run_tenant_subject",
                condition=Q(tenant_visible=True),
            ),
            models.Index(
                fields=("fanout_parent",), name="kj_run_fanout_parent", condition=~Q(fanout_parent="")
            ),
            # Tiny: runs committed but not pushed yet (the outbox rebuild.push_waiting reads).
            models.Index(
                fields=("queued_at",),
                name="kj_run_unpushed",
                condition=Q(pushed_at__isnull=True, status="queued"),
            ),
            # Small: only unfinished rows, for stale-run repair and "what is running now".
            models.Index(
                fields=("status", "updated_at"),
                name="kj_run_active",
                condition=Q(status__in=["queued", "running", "deferred"]),
            ),
            # The retries of a run (its detail page): only retries are in it.
            models.Index(fields=("retry_of",), name="kj_run_retry_of", condition=Q(retry_of__isnull=False)),
        )
        # No CHECK constraints: PostgreSQL parses and plans each one's stored expression again
        # for every INSERT and UPDATE (ExecRelCheck builds them per statement, prepared or not).
        # The seven this table had (a valid status, attempt >= 1, a finish time on finished
        # runs, four non-negative counters) cost ~20 us of the backend's ~90 us for a
        # dispatch's row and ~15 us of an outcome UPDATE: dispatch was behind RQ's enqueue by
        # about that much. Only kumiko writes these rows (records.py and the modules it names);
        # the fields' choices and validators state the rules for forms and full_clean(), which
        # kumiko's writes do not use, and the test suite checks the rows every test leaves
        # against all seven (tests/run_invariants.py).
        constraints = (
            # The arbiter of idempotent pushes and fan-out dedup (ON CONFLICT DO NOTHING).
            models.UniqueConstraint(fields=("job_id",), name="kj_run_job_id_unique"),
        )

    def __str__(self) -> str:
        return f"{self.job_name} [{self.status}] {self.job_id}"


class TenantFailure(models.Model):
    """What a tenant may know about a run that failed finally: one row per (tenant, job,
    subject), with a message key for the tenant's own UI and never the error text. Written on a
    final failure of a job declaring ``tenant_visible_failure``; a later success of the same
    (tenant, job, subject) deletes it (failure_records.py)."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=64)
    job_name = models.CharField(max_length=200)
    # Canonical JSON of the subject fields (tenant_history.subject_of); NULL without any.
    subject = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    message_key = models.CharField(max_length=200)
    count = models.PositiveIntegerField(default=1)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    # For operators: the run that failed last (never shown to the tenant).
    last_run_id = models.UUIDField(null=True, blank=True)

    class Meta:
        ordering = ("-last_failed_at",)
        indexes = (
            models.Index(fields=("tenant_id", "-last_failed_at"), name="kj_failure_tenant"),
            models.Index(fields=("last_failed_at",), name="kj_failure_age"),
        )
        # One row per key; NULL subjects compare equal only through the second constraint
        # (NULLS NOT DISTINCT is PostgreSQL 15+ only). Both are upsert targets (failure_records.py).
        constraints = (
            models.UniqueConstraint(
                fields=("tenant_id", "job_name", "subject"),
                condition=Q(subject__isnull=False),
                name="kj_failure_one_per_subject",
            ),
            models.UniqueConstraint(
                fields=("tenant_id", "job_name"),
                condition=Q(subject__isnull=True),
                name="kj_failure_one_without_subject",
            ),
            models.CheckConstraint(condition=Q(count__gte=1), name="kj_failure_count_positive"),
        )

    def __str__(self) -> str:
        return f"{self.message_key} ({self.job_name}, tenant {self.tenant_id})"


class EscapeHatchAudit(models.Model):
    """One row per (job, tenant, kind) and dedup window; ``count`` counts the uses in it."""

    id = models.BigAutoField(primary_key=True)
    job_name = models.CharField(max_length=200)
    # "" for runs without a tenant, so the one-row-per-window constraint also holds for them.
    tenant_id = models.CharField(max_length=64, blank=True, default="")
    kind = models.CharField(max_length=32)
    reason = models.TextField()
    actor = models.CharField(max_length=64)
    caller = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001  (no user)
    run_id = models.UUIDField(null=True, blank=True)
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ("-last_seen",)
        indexes = (
            models.Index(fields=("tenant_id", "-last_seen"), name="kj_audit_tenant"),
            models.Index(fields=("job_name", "kind", "-last_seen"), name="kj_audit_job_kind"),
            # Retention deletes the oldest audits in batches.
            models.Index(fields=("last_seen",), name="kj_audit_age"),
        )
        constraints = (
            models.UniqueConstraint(
                fields=("job_name", "tenant_id", "kind", "window_start"),
                name="kj_audit_one_per_window",
            ),
        )

    def __str__(self) -> str:
        return f"{self.kind} by {self.job_name} ({self.tenant_id or 'no tenant'})"


# Pages of the operator console in the admin (admin/console/). Proxies give each page a place
# in the admin index and its own view permission; they have no table of their own.
class ConsoleOverview(JobRun):
    class Meta:
        proxy = True
        verbose_name = "overview"
        verbose_name_plural = "overview"


class JobCatalog(JobRun):
    class Meta:
        proxy = True
        verbose_name = "job"
        verbose_name_plural = "job catalog"
