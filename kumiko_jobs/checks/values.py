"""Value tests shared by the checks."""

from __future__ import annotations

import math
import zoneinfo
from typing import Any


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_int_at_least(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_number_above(value: Any, minimum: float, *, inclusive: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value >= minimum if inclusive else value > minimum


def is_zone(tz: Any) -> bool:
    if not isinstance(tz, str) or not tz:
        return False
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True
