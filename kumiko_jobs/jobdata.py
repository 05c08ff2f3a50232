"""The job hash as stored in Redis: RQ's field layout with RQ's JSON serializer, never pickle.

``data`` is what RQ expects (``[func, instance, args, kwargs]``, zlib-compressed when that pays
off), so RQ tools and django-rq's dashboard can show our jobs; everything kumiko needs travels
in ``meta``.
"""

from __future__ import annotations

import json
import math
import re
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kumiko_jobs.exceptions import InvalidPayload, MalformedJob

# A real, importable entry point, so a stock RQ worker with the JSON serializer could run it too.
ENTRY_POINT = "kumiko_jobs.execution.perform_rq_job"

# Compact JSON, as json.dumps(..., separators=(",", ":")) writes it. One shared encoder: dumps()
# with any option builds a new JSONEncoder on every call (the encoder keeps no state between
# calls, so threads may share it).
compact_json = json.JSONEncoder(separators=(",", ":")).encode


def rq_time(moment: datetime) -> str:
    """A time as RQ stores it in job hashes and registries (``rq.utils.utcformat``: the
    moment's own fields, microseconds, a "Z"), from isoformat, which is ~4x quicker than the
    strftime RQ uses; every dispatch and every lane step writes one."""
    return moment.isoformat(timespec="microseconds")[:26] + "Z"


# Smaller data is stored as plain JSON, which RQ reads too (it falls back to the raw bytes when
# zlib refuses them). Measured: zlib.compress costs ~11-33 us whatever the size (it sets up
# ~256 KiB of state per call), a tenth of a whole dispatch, to save ~60 bytes of a 220-byte
# payload; from about 1 KiB the memory it saves in Redis is worth it.
COMPRESS_FROM = 1024


@dataclass(slots=True)
class JobMeta:
    """What a run carries besides its payload. Short keys: this is written for every job.

    Treat it as immutable (``dataclasses.replace`` makes a changed copy). Not ``frozen``: a
    frozen dataclass sets each of its 22 fields through ``object.__setattr__``, 3.4 us a
    dispatch against 1.0 us (measured, Python 3.13)."""

    run_id: str
    job_name: str
    lane: str
    tenant_id: str | None = None
    triggered_by: str | None = None
    trigger_name: str = ""
    correlation_id: str = ""
    attempt: int = 1
    max_attempts: int = 1
    defers: int = 0
    abandons: int = 0
    unknown_since: float | None = None
    trace: dict[str, str] = field(default_factory=dict)
    flow: str = "t|"
    limit_keys: str = ""
    # Times the run was put back because its (job, tenant) was over a cap lowered since enqueue.
    cap_defers: int = 0
    # Fan-out wrappers: the job id children ids derive from ('' = the wrapper's own).
    fanout_of: str = ""
    # Fan-out children: the job id their ids derive from (their wrapper's, or its original's).
    fanout_parent: str = ""
    # Tenant-visible history (tenant_history.py): the run's canonical subject, and whether the
    # tenant may see the run.
    subject: str | None = None
    tenant_visible: bool = False
    # Cron ticks: the tick's UTC time (epoch s); a tz="tenant" wrapper also names its zone.
    scheduled_at: float | None = None
    zone: str = ""

    def to_json(self) -> str:
        raw: dict[str, Any] = {
            "run": self.run_id,
            "job": self.job_name,
            "lane": self.lane,
            "tenant": self.tenant_id,
            "user": self.triggered_by,
            "trigger": self.trigger_name,
            "corr": self.correlation_id,
            "attempt": self.attempt,
            "max": self.max_attempts,
            "defers": self.defers,
            "abandons": self.abandons,
            "flow": self.flow,
        }
        if self.limit_keys:
            raw["lk"] = self.limit_keys
        if self.cap_defers:
            raw["cd"] = self.cap_defers
        if self.fanout_of:
            raw["fo"] = self.fanout_of
        if self.fanout_parent:
            raw["fp"] = self.fanout_parent
        if self.subject is not None:
            raw["subj"] = self.subject
        if self.tenant_visible:
            raw["tv"] = 1
        if self.unknown_since is not None:
            raw["unknown_since"] = self.unknown_since
        if self.trace:
            raw["trace"] = self.trace
        if self.scheduled_at is not None:
            raw["at"] = self.scheduled_at
        if self.zone:
            raw["zone"] = self.zone
        return compact_json(raw)

    @classmethod
    def from_json(cls, raw: bytes | str) -> JobMeta:
        """Decode and check a job's meta; MalformedJob for anything a run record cannot hold
        (a poison job is failed once, clearly, instead of breaking every worker that meets it)."""
        try:
            # Decoded first: json.loads would detect the encoding of bytes in Python.
            d = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            meta = cls(
                run_id=_run_id(d["run"]),
                job_name=_text(d["job"], 200),
                lane=_text(d["lane"], 16),
                tenant_id=_optional_text(d.get("tenant"), 64),
                triggered_by=_optional_text(d.get("user"), 64),
                trigger_name=_text(d.get("trigger") or "", 200),
                correlation_id=_text(d.get("corr") or "", 64),
                attempt=int(d.get("attempt", 1)),
                max_attempts=int(d.get("max", 1)),
                defers=int(d.get("defers", 0)),
                abandons=int(d.get("abandons", 0)),
                unknown_since=None if d.get("unknown_since") is None else float(d["unknown_since"]),
                trace={str(k): str(v) for k, v in (d.get("trace") or {}).items()},
                flow=_text(d.get("flow", "t|"), 300),
                limit_keys=_text(d.get("lk", ""), 2000),
                cap_defers=int(d.get("cd", 0)),
                # Job ids, as long as the record's job id columns (JOB_ID_LENGTH).
                fanout_of=_text(d.get("fo", ""), 255),
                fanout_parent=_text(d.get("fp", ""), 255),
                subject=_optional_text(d.get("subj"), 500),
                tenant_visible=bool(d.get("tv", 0)),
                scheduled_at=None if d.get("at") is None else float(d["at"]),
                zone=_text(d.get("zone", ""), 64),
            )
            if (
                meta.attempt < 1
                or meta.max_attempts < 1
                or min(meta.defers, meta.abandons, meta.cap_defers) < 0
            ):
                raise ValueError("attempt counters out of range")
            return meta
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MalformedJob(f"job meta is not kumiko metadata ({exc.__class__.__name__}: {exc})") from exc


def _text(value: object, max_length: int) -> str:
    if not isinstance(value, str) or len(value) > max_length:
        raise ValueError(f"{value!r:.40} is not a string of at most {max_length} characters")
    return value


def _optional_text(value: object, max_length: int) -> str | None:
    return None if value is None else _text(value, max_length)


def encode_data(
    job_name: str,
    payload: Mapping[str, Any],
    max_bytes: int | None = None,
    *,
    payload_json: str | None = None,
) -> bytes:
    """RQ's ``data`` field: ``[ENTRY_POINT, null, [job_name, payload], {}]`` as compact JSON.
    ``payload_json``: ``compact_json(payload)`` made already (the run row stores the same
    text), spliced in instead of encoding the payload a second time."""
    if payload_json is None:
        payload_json = compact_json(payload)
    raw = f'["{ENTRY_POINT}",null,[{compact_json(job_name)},{payload_json}],{{}}]'.encode()
    if max_bytes is not None and len(raw) > max_bytes:
        raise InvalidPayload(
            "$",
            f"it encodes to {len(raw):,} bytes, over KUMIKO_JOBS['MAX_PAYLOAD_BYTES'] = {max_bytes:,}; "
            "store large data elsewhere and pass its id",
        )
    return zlib.compress(raw) if len(raw) >= COMPRESS_FROM else raw


def _run_id(value: Any) -> str:
    """The run id in its canonical form; a ValueError if it is no UUID. Ours are canonical
    already, and a regular expression tells that faster than parsing one (every attempt)."""
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value
    return str(uuid.UUID(str(value)))


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def decode_payload(data: bytes) -> dict[str, Any]:
    try:
        if data[:1] == b"[":
            raw = data  # plain JSON (a zlib stream never starts with "[")
        else:
            try:
                raw = zlib.decompress(data)
            except zlib.error:
                raw = data
        func, _instance, args, _kwargs = json.loads(raw)
        payload = args[1]
    except (ValueError, TypeError, IndexError) as exc:
        raise MalformedJob(f"job data is not a kumiko job ({exc.__class__.__name__}: {exc})") from exc
    if func != ENTRY_POINT or not isinstance(payload, dict):
        raise MalformedJob(f"job data calls {func!r}, not a kumiko job")
    return payload


def _created_stamp(created: datetime) -> str:
    # In UTC, as every other stamp: a database with its own TIME_ZONE returns its local time.
    return rq_time(created.astimezone(UTC) if created.tzinfo else created)


def job_fields(
    *,
    queue_name: str,
    data: bytes,
    meta: JobMeta,
    now: datetime,
    timeout: float | None,
    result_ttl: int,
    created: datetime | None = None,
    failure_ttl: int,
    status: str,
    priority: int | None = None,
) -> list[Any]:
    """Field/value pairs of a new job hash, in RQ's format. ``data``: the payload encoded
    (``encode_data``, which checks its size); ``priority`` orders a Django task's run in its
    ordered flow (kumiko_pri, read by lua/flow_store.lua). ``created``: when the run was
    dispatched, if not ``now`` (a push from its record; lua/enqueue.lua compares it)."""
    stamp = rq_time(now)
    # Fields RQ treats as empty when absent (started_at, worker_name, ...) are left out: every
    # field is an argument of the enqueue script call.
    pairs: list[Any] = [
        "created_at", stamp if created is None else _created_stamp(created),
        "enqueued_at", stamp,
        "data", data,
        "origin", queue_name,
        "description", f"{meta.job_name} (tenant {meta.tenant_id or '-'})",
        "status", status,
        "meta", meta.to_json(),
        "result_ttl", result_ttl,
        "failure_ttl", failure_ttl,
        "kumiko_flow", meta.flow,
    ]  # fmt: skip
    if timeout:
        pairs += ["timeout", math.ceil(timeout)]
    if meta.limit_keys:
        pairs += ["kumiko_lk", meta.limit_keys]
    if priority:
        pairs += ["kumiko_pri", priority]
    return pairs


def with_meta(fields: list[Any], meta: JobMeta) -> list[Any]:
    """A copy of a job hash's field/value pairs (``job_fields``) with ``meta`` replaced."""
    copy = list(fields)
    copy[2 * fields[::2].index("meta") + 1] = meta.to_json()
    return copy
