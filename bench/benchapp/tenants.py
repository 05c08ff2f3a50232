"""ACTIVE_TENANTS of the bench settings: the demo tenants, or ``range(N)`` for the fan-out bench.

bench/tenancy.py sets KUMIKO_BENCH_FANOUT_TENANTS=N in its own process around the fan-out it
measures, so a wrapper fans out to N tenants ("0".."N-1") without N rows in the tenant table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

FANOUT_TENANTS_ENV = "KUMIKO_BENCH_FANOUT_TENANTS"


def active_tenant_ids() -> Iterable[int]:
    count = os.environ.get(FANOUT_TENANTS_ENV)
    if count:
        return range(int(count))
    from project.demo.tenants import active_tenant_ids as demo_tenants

    return demo_tenants()
