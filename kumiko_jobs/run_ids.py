"""New run ids: UUIDs of version 7 (RFC 9562), whose first 48 bits are the Unix time in
milliseconds.

A run id is the run table's primary key, and the job id and the default correlation id are
built from it, so three of the table's indexes are keyed by it. Random (version 4) keys land on
any leaf page of those indexes: each INSERT reads and dirties pages all over them, and once the
indexes outgrow shared_buffers, every one of those pages is a read from disk and a full-page
image in the WAL after each checkpoint. Time-ordered keys land on the rightmost leaf, which
PostgreSQL keeps in cache and reaches without descending the tree. Measured server-side on a
copy of the run table (PostgreSQL 15, 20,000 INSERTs after 300,000): 54-69 us a row against
83-87 with version 4 (BENCHMARKS.md, session 10).

The ids stay opaque: nothing reads the time back out of them (a run's times are its columns).
Ids a run must get deterministically (a cron tick's, a fan-out child's: uuid5 of the job id)
are made where they are needed.
"""

from __future__ import annotations

import os
import time
import uuid

_VERSION_7 = 0x7 << 76
_VARIANT_RFC = 0b10 << 62
_RAND_A = 0xFFF  # 12 bits after the version
_RAND_B = (1 << 62) - 1  # 62 bits after the variant


def new_run_id() -> uuid.UUID:
    """A new run id: 48 bits of milliseconds, then 74 random bits (version and variant set).

    Ids made within the same millisecond are ordered at random among themselves, which keeps
    them on the same rightmost pages; no counter, so no lock and no state shared by threads."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))
    return uuid.UUID(
        int=(millis << 80) | _VERSION_7 | ((rand >> 62) & _RAND_A) << 64 | _VARIANT_RFC | (rand & _RAND_B)
    )
