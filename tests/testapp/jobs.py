"""Jobs the test suite dispatches. Each records what happened in Redis under the test's prefix,
so assertions read real execution traces (also from runjobs subprocesses)."""

from __future__ import annotations

import contextvars
import functools
import json
import os
import time
from typing import Any

from kumiko_jobs import (
    Backoff,
    EscapeHatch,
    MaxPerTenant,
    TenantVisibleFailure,
    TenantVisibleRun,
    UnrecoverableError,
    cron,
    job,
    on_event,
)
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.context import JobContext


def trace(kind: str, **fields: Any) -> None:
    entry = {"kind": kind, "pid": os.getpid(), "t": time.time(), **fields}
    get_redis().rpush(f"{get_keys().prefix}:trace", json.dumps(entry))


def _ctx_fields(ctx: JobContext) -> dict[str, Any]:
    return {
        "scheduled_at": ctx.scheduled_at.isoformat() if ctx.scheduled_at else None,
        "job": ctx.job_name,
        "run_id": ctx.run_id,
        "job_id": ctx.job_id,
        "tenant": ctx.tenant_id,
        "attempt": ctx.attempt,
        "final": ctx.final_attempt,
        "user": ctx.triggered_by,
        "trigger": ctx.trigger_name,
        "corr": ctx.correlation_id,
        "lane": ctx.lane,
    }


@job(name="tests.record")
def record(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.log.info("recording %s", payload.get("n"))
    trace("record", payload=payload, **_ctx_fields(ctx))


@job(name="tests.api_record", lane="api")
def api_record(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("api_record", payload=payload, **_ctx_fields(ctx))


@job(name="tests.flaky", retries=2, backoff=Backoff("exponential", delay_ms=50))
def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("flaky", **_ctx_fields(ctx))
    if ctx.attempt < int(payload.get("succeed_on", 99)):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")


@job(name="tests.unrecoverable", retries=3)
def unrecoverable(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("unrecoverable", **_ctx_fields(ctx))
    raise UnrecoverableError("this cannot work")


@job(name="tests.slow", timeout=0.5, retries=1)
def slow(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("slow_start", **_ctx_fields(ctx))
    time.sleep(float(payload.get("seconds", 2)))
    trace("slow_end", **_ctx_fields(ctx))


@job(name="tests.sleeper", retries=1)
def sleeper(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("sleeper_start", **_ctx_fields(ctx))
    time.sleep(float(payload.get("seconds", 1)))
    trace("sleeper_end", **_ctx_fields(ctx))


# What tests.ballast allocated, kept for the life of the worker process.
_BALLAST: list[bytes] = []


@job(name="tests.ballast")
def ballast(payload: dict[str, Any], ctx: JobContext) -> None:
    """Grow this process's resident memory by ``mb`` (bytes written, so the pages are resident)."""
    _BALLAST.append(b"x" * (int(payload["mb"]) * 2**20))
    trace("ballast", **_ctx_fields(ctx))


@job(
    name="tests.on_invoice",
    trigger=[on_event("invoice.created"), on_event("invoice.paid", where={"kind": "refund"})],
)
def on_invoice(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("on_invoice", payload=payload, **_ctx_fields(ctx))


@job(name="tests.chain")
def chain(payload: dict[str, Any], ctx: JobContext) -> None:
    result = ctx.dispatch("tests.record", {"n": "chained"})
    trace("chain", child=result.job_id, **_ctx_fields(ctx))


@job(name="tests.defer", max_defers=2)
def defer(payload: dict[str, Any], ctx: JobContext) -> Any:
    trace("defer", **_ctx_fields(ctx))
    if payload.get("times", 0) > 0:
        key = f"{get_keys().prefix}:defer:{ctx.run_id}"
        if get_redis().incr(key) <= payload["times"]:
            return ctx.defer(int(payload.get("ms", 20)))
    return None


@job(name="tests.per_tenant", per_tenant=True)
def per_tenant(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("per_tenant", payload=payload, **_ctx_fields(ctx))


@job(name="tests.hatch", escape_hatch=EscapeHatch("tests read across tenants", grants=("unscoped",)))
def hatch(payload: dict[str, Any], ctx: JobContext) -> None:
    with ctx.unscoped():
        trace("hatch", **_ctx_fields(ctx))


@job(name="tests.hang_first", retries=0)
def hang_first(payload: dict[str, Any], ctx: JobContext) -> None:
    """Blocks on its first attempt only (for killing a worker mid-job); later attempts are quick."""
    trace("hang_first_start", **_ctx_fields(ctx))
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 60)))
    trace("hang_first_end", **_ctx_fields(ctx))


# --- tenancy gates (tests/test_gates.py and integration tests) -------------------------------


def _timed(kind: str, payload: dict[str, Any], ctx: JobContext) -> None:
    trace(f"{kind}_start", payload=payload, **_ctx_fields(ctx))
    time.sleep(float(payload.get("seconds", 0)))
    trace(f"{kind}_end", payload=payload, **_ctx_fields(ctx))


@job(name="tests.capped", max_per_tenant=MaxPerTenant(2, on_limit="defer"))
def capped(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("capped", payload, ctx)


@job(name="tests.limited", max_per_tenant=3)
def limited(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("limited", payload, ctx)


@job(name="tests.sequential", concurrency="sequential", retries=1)
def sequential(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("sequential", payload, ctx)


@job(name="tests.skipping", concurrency="skip")
def skipping(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("skipping", payload, ctx)


@job(name="tests.replacing", concurrency="replace")
def replacing(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("replacing", payload, ctx)


@job(name="tests.capped_replacing", concurrency="replace", max_per_tenant=MaxPerTenant(1, on_limit="defer"))
def capped_replacing(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("capped_replacing", payload, ctx)


@job(name="tests.replacing_limited", concurrency="replace", max_per_tenant=1)
def replacing_limited(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("replacing_limited", payload, ctx)


@job(name="tests.debounced", concurrency="debounce", debounce_ms=200)
def debounced(payload: dict[str, Any], ctx: JobContext) -> None:
    _timed("debounced", payload, ctx)


@job(name="tests.notes")
def notes(payload: dict[str, Any], ctx: JobContext) -> None:
    """Reads through a django-scopes manager: sees only the run's tenant."""
    from project.demo.models import Note

    trace("notes", seen=sorted({n.tenant_id for n in Note.objects.all()}), **_ctx_fields(ctx))


@job(name="tests.notes_unscoped_denied")
def notes_unscoped_denied(payload: dict[str, Any], ctx: JobContext) -> None:
    with ctx.cross_tenant_reads():
        trace("never")


def _write_unscoped(ctx: JobContext) -> None:
    from project.demo.models import Note

    with ctx.unscoped():
        tenant_ids = sorted({n.tenant_id for n in Note.objects.all()})
        try:
            Note.objects.create(tenant_id=tenant_ids[-1], text="written unscoped")
            wrote = True
        except Exception as exc:  # the refusal is what the test checks
            wrote = False
            trace("write_refused", error=f"{exc.__class__.__name__}: {exc}")
    trace("unscoped_write", seen=tenant_ids, wrote=wrote, **_ctx_fields(ctx))


@job(name="tests.unscoped_reads", escape_hatch=EscapeHatch("tests: report", grants=("unscoped",)))
def unscoped_reads(payload: dict[str, Any], ctx: JobContext) -> None:
    _write_unscoped(ctx)


@job(
    name="tests.unscoped_writes",
    escape_hatch=EscapeHatch("tests: repair", grants=("unscoped", "global_writes")),
)
def unscoped_writes(payload: dict[str, Any], ctx: JobContext) -> None:
    _write_unscoped(ctx)


@job(
    name="tests.cross_reads",
    escape_hatch=EscapeHatch("tests: cross-tenant report", grants=("unscoped",)),
)
def cross_reads(payload: dict[str, Any], ctx: JobContext) -> None:
    from project.demo.models import Note

    with ctx.cross_tenant_reads():
        seen = sorted({n.tenant_id for n in Note.objects.all()})
        try:
            Note.objects.create(tenant_id=seen[0], text="write inside reads")
            wrote = True
        except Exception as exc:  # the refusal is what the test checks
            wrote = False
            trace("write_refused", error=f"{exc.__class__.__name__}: {exc}")
    trace("cross_reads", seen=seen, wrote=wrote, **_ctx_fields(ctx))


@job(name="tests.per_tenant_retry", per_tenant=True, retries=1)
def per_tenant_retry(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("per_tenant_retry", **_ctx_fields(ctx))


@job(name="tests.limited_event", trigger=on_event("limited.happened"), max_per_tenant=1)
def limited_event(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("limited_event", **_ctx_fields(ctx))


@job(name="tests.sequential_flaky", concurrency="sequential", concurrency_scope="job", retries=1)
def sequential_flaky(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("sequential_flaky", **_ctx_fields(ctx))
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


# --- tenancy end to end (tests/integration/test_tenancy_e2e.py) ------------------------------


@job(name="tests.hatch_slow", escape_hatch=EscapeHatch("tests read across tenants", grants=("unscoped",)))
def hatch_slow(payload: dict[str, Any], ctx: JobContext) -> None:
    """Uses the unscoped hatch, then keeps its worker busy so the next run goes to another one."""
    with ctx.unscoped():
        trace("hatch_slow", **_ctx_fields(ctx))
    time.sleep(float(payload.get("seconds", 0)))


@job(
    name="tests.hatch_in_transaction",
    escape_hatch=EscapeHatch("tests read across tenants", grants=("unscoped",)),
)
def hatch_in_transaction(payload: dict[str, Any], ctx: JobContext) -> None:
    """Uses the unscoped hatch inside a transaction that stays open for payload["seconds"]."""
    from django.db import transaction

    with transaction.atomic():
        with ctx.unscoped():
            trace("hatch_in_transaction", **_ctx_fields(ctx))
        time.sleep(float(payload.get("seconds", 0)))


@job(
    name="tests.per_tenant_limited",
    per_tenant=True,
    max_per_tenant=100,
    retries=1,
    backoff=Backoff("fixed", delay_ms=3000),
)
def per_tenant_limited(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fan-out whose children pass a per-tenant skip limit (a test breaks one tenant's counter
    to make the wrapper's first attempt fail midway); the wrapper retries after 3 s."""
    trace("per_tenant_limited", **_ctx_fields(ctx))


@job(
    name="tests.hatch_rollback",
    escape_hatch=EscapeHatch("tests: audit outlives rollback", grants=("unscoped",)),
)
def hatch_rollback(payload: dict[str, Any], ctx: JobContext) -> None:
    from django.db import transaction

    try:
        with transaction.atomic():
            with ctx.unscoped():
                trace("hatch_rollback")
            raise RuntimeError("roll back the handler's own writes")
    except RuntimeError:
        pass


# --- database connections between jobs (tests/test_db_connections.py) -------------------------


@job(name="tests.leaves_transaction_open")
def leaves_transaction_open(payload: dict[str, Any], ctx: JobContext) -> None:
    """Enters atomic() and never leaves it (a bug in a handler): its write must not survive."""
    from django.db import transaction

    from project.demo.models import Note

    transaction.atomic().__enter__()
    Note.objects.create(tenant_id=ctx.tenant_id, text="left in an open transaction")


@job(name="tests.hatch_left_open", escape_hatch=EscapeHatch("tests: a report", grants=("unscoped",)))
def hatch_left_open(payload: dict[str, Any], ctx: JobContext) -> None:
    """Uses a hatch, then leaves a transaction open: the audit must not go down with it."""
    from django.db import transaction

    with ctx.unscoped():
        trace("hatch_left_open")
    transaction.atomic().__enter__()


@job(name="tests.breaks_connection")
def breaks_connection(payload: dict[str, Any], ctx: JobContext) -> None:
    """Closes the database socket under Django's feet (a server restart, a pooler timeout)."""
    from django.db import connection

    connection.ensure_connection()
    assert connection.connection is not None
    connection.connection.close()


# --- tenant-visible history (tests/test_tenant_history.py, admin and browser tests) ----------


class PartnerDown(RuntimeError):
    """A project's user-facing error: it names its own message key for the tenant."""

    message_key = "billing.partner_down"


@job(
    name="tests.export_invoice",
    retries=1,
    tenant_visible_run=TenantVisibleRun(subject_fields=("invoice_id", "format")),
    tenant_visible_failure=TenantVisibleFailure("billing.export_failed"),
)
def export_invoice(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fails while payload "fail" says so: "attempt1" (first attempt only), "always", "partner"
    (a PartnerDown, with its own message key) or "unrecoverable"."""
    trace("export_invoice", payload=payload, **_ctx_fields(ctx))
    fail = payload.get("fail")
    if fail == "always" or (fail == "attempt1" and ctx.attempt == 1):
        raise RuntimeError(f"secret provider text for invoice {payload.get('invoice_id')}")
    if fail == "partner":
        raise PartnerDown("partner said 503 to card 4111 1111 1111 1111")
    if fail == "unrecoverable":
        raise UnrecoverableError("template missing")
    if fail == "switch":
        # Fails until the test sets the switch: a later success of the same subject.
        if not get_redis().exists(f"{get_keys().prefix}:switch"):
            raise RuntimeError("not yet")


@job(name="tests.failure_only", tenant_visible_failure=TenantVisibleFailure("sync.failed"))
def failure_only(payload: dict[str, Any], ctx: JobContext) -> None:
    """Tenant-visible failures without a subject and without visible runs."""
    if payload.get("fail"):
        raise RuntimeError("boom")


@job(name="tests.replaceable", concurrency="replace", tenant_visible_run=TenantVisibleRun())
def replaceable(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("replaceable", payload=payload, **_ctx_fields(ctx))


# --- chaos suite (tests/chaos/) ----------------------------------------------------------------


def _ledger(event: str, ctx: JobContext) -> None:
    """One line per start/end in a file (not Redis: the chaos suite wipes Redis)."""
    path = os.environ.get("KUMIKO_CHAOS_LEDGER")
    if not path:
        return
    line = f"{event} {ctx.run_id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of < PIPE_BUF bytes with O_APPEND: never interleaved
    finally:
        os.close(fd)


@job(name="tests.chaos_work")
def chaos_work(payload: dict[str, Any], ctx: JobContext) -> None:
    _ledger("start", ctx)
    time.sleep(float(payload.get("ms", 5)) / 1000)
    _ledger("end", ctx)


# --- job threads (tests/integration/test_concurrency.py) -------------------------------------


@job(name="tests.busy_loop", timeout=0.5, retries=1)
def busy_loop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Pure Python until told to stop: an asynchronous JobTimeout reaches it in a job thread."""
    trace("busy_loop_start", **_ctx_fields(ctx))
    end = time.monotonic() + float(payload.get("seconds", 30))
    while time.monotonic() < end:
        pass
    trace("busy_loop_end", **_ctx_fields(ctx))


@job(name="tests.stuck", timeout=0.5, retries=1)
def stuck(payload: dict[str, Any], ctx: JobContext) -> None:
    """Blocked in C code (a first attempt only): no exception reaches it in a job thread."""
    trace("stuck_start", **_ctx_fields(ctx))
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 60)))
    trace("stuck_end", **_ctx_fields(ctx))


# --- schedules and boot (tests/integration/test_schedules.py, test_boot.py) -------------------
# Opt-in per process: a schedule declared here would fire in every test's workers. A runjobs
# subprocess started with KUMIKO_TEST_SCHEDULES="every_second,boot_job" declares those.
ENABLED = set(filter(None, os.environ.get("KUMIKO_TEST_SCHEDULES", "").split(",")))


def _declare(name: str, **options: Any) -> Any:
    def decorate(func: Any) -> Any:
        return job(name=f"tests.{name}", **options)(func) if name in ENABLED else func

    return decorate


@_declare("every_second", trigger=cron("* * * * * *"))
def every_second(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("every_second", **_ctx_fields(ctx))


@_declare("tenant_every_second", trigger=cron("* * * * * *", tz="tenant"), per_tenant=True)
def tenant_every_second(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("tenant_every_second", **_ctx_fields(ctx))


@_declare("old_schedule", trigger=cron("0 0 1 1 *"))
def old_schedule(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("old_schedule", **_ctx_fields(ctx))


@_declare("boot_job", run_on_boot=True)
def boot_job(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("boot_job", **_ctx_fields(ctx))


@_declare("gate_ok", boot_gate=True)
def gate_ok(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("gate_ok", **_ctx_fields(ctx))


@_declare("gate_fail", boot_gate=True)
def gate_fail(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("gate_fail", **_ctx_fields(ctx))
    raise RuntimeError("schema is behind: run migrations")


@_declare("gate_flips", boot_gate=True)
def gate_flips(payload: dict[str, Any], ctx: JobContext) -> None:
    """Passes until its key is set: a release whose gate fails once the code on disk changed."""
    trace("gate_flips", **_ctx_fields(ctx))
    if get_redis().exists(f"{get_keys().prefix}:gate_flips"):
        raise RuntimeError("schema is behind: run migrations")


@_declare("gate_timeout", boot_gate=True, timeout=0.5)
def gate_timeout(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("gate_timeout", **_ctx_fields(ctx))
    time.sleep(30)


@_declare("gate_slow", boot_gate=True)
def gate_slow(payload: dict[str, Any], ctx: JobContext) -> None:
    time.sleep(float(os.environ.get("KUMIKO_TEST_GATE_SECONDS", "2")))
    trace("gate_slow", **_ctx_fields(ctx))


@_declare("gate_defer", boot_gate=True)
def gate_defer(payload: dict[str, Any], ctx: JobContext) -> Any:
    return ctx.defer(100)


# --- scrubbing (tests/test_scrubbing.py, tests/test_observability.py) ---------------------------

# Fake personal data and secrets the scrubber must remove.
SECRET_TEXT = (
    "mail ann@example.com, header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig, "
    "dsn postgres://app:hunter2@db.internal:5432/prod, card 4111 1111 1111 1111"
)
FAKE_TOKEN = "Bearer abcdefgh12345678"


@job(name="tests.raise_secret")
def raise_secret(payload: dict[str, Any], ctx: JobContext) -> None:
    """Logs and raises text full of personal data and secrets (it must be scrubbed)."""
    ctx.log.info("working for %s", "ann@example.com")
    ctx.log.child(token=FAKE_TOKEN).warning("retrying with card 5555-5555-5555-4444")
    raise ValueError(SECRET_TEXT)


@job(name="tests.raise_long", retries=1, backoff=Backoff("fixed", delay_ms=10))
def raise_long(payload: dict[str, Any], ctx: JobContext) -> None:
    """Raises a message of payload["chars"] characters (a response body pasted into an error)."""
    raise RuntimeError("x" * int(payload["chars"]))


@job(name="tests.odd_text")
def odd_text(payload: dict[str, Any], ctx: JobContext) -> None:
    """Logs, and may raise, text with a NUL and a lone surrogate (bytes decoded carelessly)."""
    ctx.log.info("read %s", "a\x00b\ud800c")
    if payload.get("fail"):
        raise ValueError("bad\x00bytes\udcff")


# --- async def handlers (tests/test_async_handlers.py) -----------------------------------------


@job(name="tests.async_record")
async def async_record(payload: dict[str, Any], ctx: JobContext) -> None:
    """Awaits, logs, reads the active tenant, and chains jobs both ways when asked."""
    import asyncio

    from kumiko_jobs.tenancy import current_tenant_id

    await asyncio.sleep(0)
    ctx.log.info("async handler ran for %s", ctx.tenant_id)
    fields = {"active_tenant": current_tenant_id(), **_ctx_fields(ctx)}
    if payload.get("chain"):
        fields["chained"] = ctx.dispatch("tests.record", {"n": "from-async"}).run_id
    if payload.get("achain"):
        fields["achained"] = (await ctx.adispatch("tests.record", {"n": "from-async-a"})).run_id
    if payload.get("leak"):
        # A task left running: cancelled when the handler returns, never run in a later job.
        async def leaked() -> None:
            await asyncio.sleep(0.05)
            trace("leaked_ran")

        asyncio.get_running_loop().create_task(leaked())
    trace("async_record", payload=payload, **fields)


@job(name="tests.async_slow", timeout=0.2, retries=1)
async def async_slow(payload: dict[str, Any], ctx: JobContext) -> None:
    import asyncio

    trace("async_slow_start", **_ctx_fields(ctx))
    await asyncio.sleep(float(payload.get("seconds", 2)))
    trace("async_slow_end", **_ctx_fields(ctx))


@job(name="tests.async_blocking", timeout=0.2)
async def async_blocking(payload: dict[str, Any], ctx: JobContext) -> None:
    """Blocks without awaiting: the loop's cancellation never reaches it."""
    import time

    trace("async_blocking_start", **_ctx_fields(ctx))
    time.sleep(float(payload.get("seconds", 5)))  # deliberately blocking
    trace("async_blocking_end", **_ctx_fields(ctx))


@job(name="tests.async_db_blocking", timeout=0.2)
async def async_db_blocking(payload: dict[str, Any], ctx: JobContext) -> None:
    """Awaits a blocking call on the database thread: cancelled at its timeout, the call runs on."""
    import time

    from asgiref.sync import sync_to_async

    trace("async_db_blocking_start", **_ctx_fields(ctx))
    await sync_to_async(time.sleep)(float(payload.get("seconds", 4)))
    trace("async_db_blocking_end", **_ctx_fields(ctx))


@job(name="tests.async_note")
async def async_note(payload: dict[str, Any], ctx: JobContext) -> None:
    """Django's async ORM inside the tenant's scope (activated around the coroutine)."""
    from project.demo.models import Note

    note = await Note.objects.acreate(tenant_id=ctx.tenant_id, text=str(payload.get("text", "async")))
    seen = sorted({n.tenant_id async for n in Note.objects.all()})
    trace("async_note", note=note.pk, seen=seen, **_ctx_fields(ctx))


# --- context variables and awaitables of sync callables (tests/test_execution.py) ------------

LEAKY: contextvars.ContextVar[str | None] = contextvars.ContextVar("kumiko_tests_leaky", default=None)


@job(name="tests.sets_a_context_variable")
def sets_a_context_variable(payload: dict[str, Any], ctx: JobContext) -> None:
    LEAKY.set(str(ctx.tenant_id))  # as translation.activate() or structlog's bind_contextvars do


def _returns_its_coroutine(func: Any) -> Any:
    """A sync decorator around an async def (as some libraries' are): the result is not a
    coroutine function, but calling it returns a coroutine."""

    @functools.wraps(func)
    def wrapper(payload: dict[str, Any], ctx: JobContext) -> Any:
        return func(payload, ctx)

    return wrapper


@job(name="tests.async_callable")
@_returns_its_coroutine
async def async_callable(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("async_callable", **_ctx_fields(ctx))
